# make test   every test, with -race and the idemfault build tag, starting
#             the servers the tests need (scripts/test.sh: details and the
#             variables it reads)
#               make test ARGS='-run TestX ./inbox/'   # other go test arguments
#               IDEM_TEST_SERVERS=postgres make test ARGS=./inbox/   # start only PostgreSQL
# make lint   gofmt -l, go vet and staticcheck, with and without the tag
#             (scripts/lint.sh; installs staticcheck into .bin/ the first time)
# make image  the container images localhost/idem:VERSION and
#             localhost/idem-shop:VERSION, FROM scratch with a static binary
#             each (scripts/image.sh; podman; docs/DEPLOYMENT.md)
#               make image IMAGES=idem
# make fuzz   every fuzz target for FUZZTIME each (scripts/fuzz.sh)
#               make fuzz FUZZTIME=1m FUZZ=FuzzDecode
# make chaos  shopctl chaos --random (internal/tools/shopctl) for
#             CHAOS_DURATION (10m) on two stacks: the embedded defaults
#             (SQLite, NATS run as its own process) and PostgreSQL +
#             RabbitMQ, CHAOS_REPLICAS (3) processes of each service sharing
#             CHAOS_PARTITIONS (4) partitions of a shop built with the
#             idemfault tag; prints a verdict table per stack and fails if a
#             check fails

ARGS ?=
FUZZTIME ?= 10s
FUZZ ?= .
CHAOS_DURATION ?= 10m
CHAOS_REPLICAS ?= 3
CHAOS_PARTITIONS ?= 4
IMAGES ?= idem shop

.PHONY: test lint image fuzz chaos

test:
	bash scripts/test.sh $(ARGS)

lint:
	bash scripts/lint.sh

image:
	bash scripts/image.sh $(IMAGES)

fuzz:
	FUZZTIME='$(FUZZTIME)' FUZZ='$(FUZZ)' IDEM_TEST_SERVERS=postgres IDEM_TEST_SHELL=1 \
		IDEM_TEST_CMD='bash scripts/fuzz.sh' bash scripts/test.sh

chaos:
	go build -tags idemfault -o .bin/shop-chaos ./cmd/shop
	go build -o .bin/shopctl ./internal/tools/shopctl
	.bin/shopctl chaos --shop .bin/shop-chaos --random $(CHAOS_DURATION) --replicas $(CHAOS_REPLICAS) --partitions $(CHAOS_PARTITIONS)
	IDEM_TEST_SERVERS="postgres rabbitmq" IDEM_TEST_SHELL=1 \
		IDEM_TEST_CMD='.bin/shopctl chaos --shop .bin/shop-chaos --random $(CHAOS_DURATION) --replicas $(CHAOS_REPLICAS) --partitions $(CHAOS_PARTITIONS) --db "$$IDEM_TEST_POSTGRES_URL" --broker "$$IDEM_TEST_AMQP_URL"' \
		bash scripts/test.sh
