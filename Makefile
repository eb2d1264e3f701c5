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
# make chaos  shopctl chaos --random --strict (internal/tools/shopctl) for
#             CHAOS_DURATION (10m) on three stacks, one after the other: the
#             embedded defaults (SQLite, NATS run as its own process and
#             faulted too, the polling relay); PostgreSQL + RabbitMQ with
#             the CDC relay; MariaDB + Kafka (kfake, run by shopctl) with
#             the binlog relay, the database servers (private ones,
#             started by scripts/test.sh) crashed, frozen and their commits
#             held too. CHAOS_REPLICAS (3) processes of each service,
#             sharing CHAOS_PARTITIONS (4) partitions on the embedded
#             stack, CHAOS_RATE (15; CHAOS_EMBEDDED_RATE, 5, on SQLite)
#             orders per second, a 5-minute settle, a shop built with
#             -race and the idemfault tag; prints every fault and a
#             verdict table per stack and fails if a check fails or does
#             not run (docs/RELIABILITY.md)
ARGS ?=
FUZZTIME ?= 10s
FUZZ ?= .
CHAOS_DURATION ?= 10m
CHAOS_REPLICAS ?= 3
CHAOS_PARTITIONS ?= 4
CHAOS_RATE ?= 15
# The embedded stack's processes share each SQLite file's one write lock.
CHAOS_EMBEDDED_RATE ?= 5
CHAOS = .bin/shopctl chaos --shop .bin/shop-chaos --strict --random $(CHAOS_DURATION) --replicas $(CHAOS_REPLICAS) --settle 5m
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
	go build -race -tags idemfault -o .bin/shop-chaos ./cmd/shop
	go build -o .bin/shopctl ./internal/tools/shopctl
	$(CHAOS) --rate $(CHAOS_EMBEDDED_RATE) --partitions $(CHAOS_PARTITIONS)
	IDEM_TEST_SERVERS="postgres rabbitmq" IDEM_TEST_SHELL=1 \
		IDEM_TEST_CMD='$(CHAOS) --rate $(CHAOS_RATE) --relay cdc --db "$$IDEM_TEST_POSTGRES_URL" --db-start "$$IDEM_TEST_POSTGRES_START" --broker "$$IDEM_TEST_AMQP_URL"' \
		bash scripts/test.sh
	IDEM_TEST_SERVERS="mariadb" IDEM_TEST_SHELL=1 \
		IDEM_TEST_CMD='$(CHAOS) --rate $(CHAOS_RATE) --relay cdc --db "$$IDEM_TEST_MARIADB_URL" --db-start "$$IDEM_TEST_MARIADB_START" --broker kfake' \
		bash scripts/test.sh
