"""A checked archive as an HTTP response, for the API and the dashboard alike."""

import asyncio
import os
from typing import BinaryIO

from django.http import StreamingHttpResponse


def archive_response(row, kind: str, archive: BinaryIO) -> StreamingHttpResponse:
    """A checked tar (`persistence.download`'s file) sent a MiB at a time, read on a thread, and
    closed after (or when the client leaves). An async iterator: Django's ASGI handler would read
    a synchronous one (a FileResponse) whole into memory before sending a byte."""
    async def chunks():
        try:
            while data := await asyncio.to_thread(archive.read, 1 << 20):
                yield data
        finally:
            archive.close()

    response = StreamingHttpResponse(chunks(), content_type="application/x-tar")
    response["Content-Length"] = str(os.fstat(archive.fileno()).st_size)
    label = getattr(row, "name", "") or kind[:-1]
    response["Content-Disposition"] = f'attachment; filename="{label}-{row.digest[:12]}.tar"'
    return response
