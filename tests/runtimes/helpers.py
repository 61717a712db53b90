from dataclasses import dataclass, field

from sessions.runtimes.base import Chunk, ExitStatus


@dataclass
class Result:
    status: ExitStatus
    chunks: list[Chunk] = field(default_factory=list)

    def out(self, stream: str = "stdout") -> bytes:
        return b"".join(chunk.data for chunk in self.chunks if chunk.stream == stream)

    @property
    def stdout(self) -> str:
        return self.out("stdout").decode(errors="replace")

    @property
    def stderr(self) -> str:
        return self.out("stderr").decode(errors="replace")


def run(driver, sandbox, argv, **options) -> Result:
    chunks, status = [], None
    for event in driver.exec(sandbox, argv, **options):
        if isinstance(event, ExitStatus):
            assert status is None, "exactly one ExitStatus ends an exec"
            status = event
        else:
            assert status is None, "no output after the ExitStatus"
            chunks.append(event)
    assert status is not None
    return Result(status=status, chunks=chunks)


def py(driver, sandbox, code: str, *args: str, **options) -> Result:
    return run(driver, sandbox, ["python3", "-c", code, *args], **options)
