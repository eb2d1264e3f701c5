# `make test` runs every test, starting the servers the tests need
# (see scripts/test.sh for the details and the variables it reads).
#   make test                               # go test -race -count=1 ./...
#   make test ARGS='-run TestX ./inbox/'    # other go test arguments
#   IDEM_TEST_SERVERS=postgres make test ARGS=./inbox/   # start only PostgreSQL

ARGS ?=

.PHONY: test

test:
	bash scripts/test.sh $(ARGS)
