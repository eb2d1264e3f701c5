# make test   every test, with -race and the idemfault build tag, starting
#             the servers the tests need (scripts/test.sh: details and the
#             variables it reads)
#               make test ARGS='-run TestX ./inbox/'   # other go test arguments
#               IDEM_TEST_SERVERS=postgres make test ARGS=./inbox/   # start only PostgreSQL
# make lint   gofmt -l, go vet and staticcheck, with and without the tag
#             (scripts/lint.sh; installs staticcheck into .bin/ the first time)
# make fuzz   every fuzz target for FUZZTIME each (scripts/fuzz.sh)
#               make fuzz FUZZTIME=1m FUZZ=FuzzDecode

ARGS ?=
FUZZTIME ?= 10s
FUZZ ?= .

.PHONY: test lint fuzz

test:
	bash scripts/test.sh $(ARGS)

lint:
	bash scripts/lint.sh

fuzz:
	FUZZTIME='$(FUZZTIME)' FUZZ='$(FUZZ)' IDEM_TEST_SERVERS=postgres IDEM_TEST_SHELL=1 \
		IDEM_TEST_CMD='bash scripts/fuzz.sh' bash scripts/test.sh
