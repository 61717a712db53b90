# Airlock: `make run` starts it on the embedded defaults, `make test` runs every check.
.PHONY: run test lint bench clean

run:
	@./scripts/run.sh

test:
	@./scripts/test.sh

lint:
	@./scripts/bootstrap.sh dev && .venv/bin/ruff check .

clean:
	rm -rf .venv var .pytest_cache
