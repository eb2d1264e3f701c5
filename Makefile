# `make test` runs every test, starting the servers the tests need
# (see scripts/test.sh for the details and the variables it reads).
#   make test                               # go test -race -count=1 ./...
#   make test ARGS='-run TestX ./inbox/'    # other go test arguments
#   make test-all                           # with postgres, mariadb and rabbitmq
#   IDEM_TEST_SERVERS="postgres rabbitmq" make test

ARGS ?=

.PHONY: test test-all

test:
	bash scripts/test.sh $(ARGS)

test-all:
	IDEM_TEST_SERVERS="postgres mariadb rabbitmq" bash scripts/test.sh $(ARGS)
