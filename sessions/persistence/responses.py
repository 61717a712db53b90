"""A checked archive as an HTTP response, for the API and the dashboard alike."""

import asyncio

from django.http import StreamingHttpResponse

from sessions.persistence.services import CheckedArchive


def archive_response(row, kind: str, archive: CheckedArchive) -> StreamingHttpResponse:
    """A checked tar (`persistence.download`'s) sent a MiB at a time, read on a thread, and
    closed after (or when the client leaves), which lets its tenant's blob read go. An async
    iterator: Django's ASGI handler reads a synchronous one (a FileResponse) whole into memory
    before it sends a byte."""
    async def chunks():
        try:
            while data := await asyncio.to_thread(archive.read, 1 << 20):
                yield data
        finally:
            archive.close()

    response = StreamingHttpResponse(chunks(), content_type="application/x-tar")
    response["Content-Length"] = str(archive.size())
    label = getattr(row, "name", "") or kind[:-1]
    response["Content-Disposition"] = f'attachment; filename="{label}-{row.digest[:12]}.tar"'
    return response
