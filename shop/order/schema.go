package order

import (
	"fmt"
	"strings"

	"github.com/idem-go/idem/shop/store"
)

// migrations are the order service's own tables, per dialect. The outbox,
// processed_event, failed_message and idempotent_request tables are idem's
// (migrate.Up). Version 1 kept Idempotency-Keys in a table of the service's
// own; version 2 moves them to idem's idempotent_request.
var migrations = store.Migrations{
	store.Postgres: {`
CREATE TABLE orders (
    id              varchar(64)  PRIMARY KEY,
    customer_id     varchar(100) NOT NULL,
    status          varchar(20)  NOT NULL,
    fulfilment      varchar(40)  NOT NULL,
    fulfilment_rank integer      NOT NULL DEFAULT 0,
    pickup_id       varchar(100),
    version         bigint       NOT NULL,
    created_at      timestamptz  NOT NULL,
    updated_at      timestamptz  NOT NULL
);
CREATE TABLE order_line (
    order_id   varchar(64)   NOT NULL REFERENCES orders (id),
    line_no    integer       NOT NULL,
    product_id varchar(100)  NOT NULL,
    quantity   numeric(12,3) NOT NULL,
    PRIMARY KEY (order_id, line_no)
);
CREATE TABLE idempotency_key (
    idem_key        varchar(255) PRIMARY KEY,
    request_hash    varchar(64)  NOT NULL,
    state           varchar(12)  NOT NULL,
    owner           varchar(36)  NOT NULL,
    response_status integer,
    response_body   text,
    locked_until    timestamptz  NOT NULL,
    expires_at      timestamptz  NOT NULL,
    created_at      timestamptz  NOT NULL
);
CREATE INDEX idempotency_key_expires_idx ON idempotency_key (expires_at);
`, `
-- Idempotency-Keys move to idem's table (package idempotency, idem
-- migration 0004, applied before this one): keys still remembered are
-- copied, with the Content-Type the service replayed them with, so that a
-- retry of a request answered before the upgrade still gets its response.
INSERT INTO idempotent_request (scope, idem_key, fingerprint, state, owner, response_status, response_headers,
    response_body, locked_until, expires_at, created_at, completed_at)
SELECT '', k.idem_key, k.request_hash, k.state, k.owner, k.response_status,
    CASE WHEN k.state = 'done' THEN '{"Content-Type":["application/json"]}' END,
    convert_to(k.response_body, 'UTF8'), k.locked_until, k.expires_at, k.created_at,
    CASE WHEN k.state = 'done' THEN k.created_at END
FROM idempotency_key k
WHERE NOT EXISTS (SELECT 1 FROM idempotent_request r WHERE r.scope = '' AND r.idem_key = k.idem_key);
DROP TABLE idempotency_key;
`},
	store.MySQL: {`
CREATE TABLE orders (
    id              VARCHAR(64)  NOT NULL PRIMARY KEY,
    customer_id     VARCHAR(100) NOT NULL,
    status          VARCHAR(20)  NOT NULL,
    fulfilment      VARCHAR(40)  NOT NULL,
    fulfilment_rank INT          NOT NULL DEFAULT 0,
    pickup_id       VARCHAR(100),
    version         BIGINT       NOT NULL,
    created_at      DATETIME(6)  NOT NULL,
    updated_at      DATETIME(6)  NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE TABLE order_line (
    order_id   VARCHAR(64)   NOT NULL,
    line_no    INT           NOT NULL,
    product_id VARCHAR(100)  NOT NULL,
    quantity   DECIMAL(12,3) NOT NULL,
    PRIMARY KEY (order_id, line_no),
    CONSTRAINT order_line_order_fk FOREIGN KEY (order_id) REFERENCES orders (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE TABLE idempotency_key (
    idem_key        VARCHAR(255) NOT NULL PRIMARY KEY,
    request_hash    VARCHAR(64)  NOT NULL,
    state           VARCHAR(12)  NOT NULL,
    owner           VARCHAR(36)  NOT NULL,
    response_status INT,
    response_body   MEDIUMTEXT,
    locked_until    DATETIME(6)  NOT NULL,
    expires_at      DATETIME(6)  NOT NULL,
    created_at      DATETIME(6)  NOT NULL,
    INDEX idempotency_key_expires_idx (expires_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
`, `
-- Idempotency-Keys move to idem's table (see the PostgreSQL version).
INSERT INTO idempotent_request (scope, idem_key, fingerprint, state, owner, response_status, response_headers,
    response_body, locked_until, expires_at, created_at, completed_at)
SELECT '', k.idem_key, k.request_hash, k.state, k.owner, k.response_status,
    CASE WHEN k.state = 'done' THEN '{"Content-Type":["application/json"]}' END,
    CAST(k.response_body AS BINARY), k.locked_until, k.expires_at, k.created_at,
    CASE WHEN k.state = 'done' THEN k.created_at END
FROM idempotency_key k
WHERE NOT EXISTS (SELECT 1 FROM idempotent_request r WHERE r.scope = '' AND r.idem_key = k.idem_key);
DROP TABLE idempotency_key;
`},
	// SQLite: times in "timestamp" columns (read back as time.Time), written
	// in UTC as text that sorts like the times; quantities as text, exactly
	// as written ("2.000").
	store.SQLite: {`
CREATE TABLE orders (
    id              TEXT      NOT NULL PRIMARY KEY,
    customer_id     TEXT      NOT NULL,
    status          TEXT      NOT NULL,
    fulfilment      TEXT      NOT NULL,
    fulfilment_rank INTEGER   NOT NULL DEFAULT 0,
    pickup_id       TEXT,
    version         INTEGER   NOT NULL,
    created_at      timestamp NOT NULL,
    updated_at      timestamp NOT NULL
);
CREATE TABLE order_line (
    order_id   TEXT    NOT NULL REFERENCES orders (id),
    line_no    INTEGER NOT NULL,
    product_id TEXT    NOT NULL,
    quantity   TEXT    NOT NULL,
    PRIMARY KEY (order_id, line_no)
);
CREATE TABLE idempotency_key (
    idem_key        TEXT      NOT NULL PRIMARY KEY,
    request_hash    TEXT      NOT NULL,
    state           TEXT      NOT NULL,
    owner           TEXT      NOT NULL,
    response_status INTEGER,
    response_body   TEXT,
    locked_until    timestamp NOT NULL,
    expires_at      timestamp NOT NULL,
    created_at      timestamp NOT NULL
);
CREATE INDEX idempotency_key_expires_idx ON idempotency_key (expires_at);
`, `
-- Idempotency-Keys move to idem's table (see the PostgreSQL version). idem
-- keeps SQLite times as UTC text 'YYYY-MM-DD HH:MM:SS.fff...'.
INSERT INTO idempotent_request (scope, idem_key, fingerprint, state, owner, response_status, response_headers,
    response_body, locked_until, expires_at, created_at, completed_at)
SELECT '', k.idem_key, k.request_hash, k.state, k.owner, k.response_status,
    CASE WHEN k.state = 'done' THEN '{"Content-Type":["application/json"]}' END,
    CAST(k.response_body AS BLOB),
    strftime('%Y-%m-%d %H:%M:%f', k.locked_until), strftime('%Y-%m-%d %H:%M:%f', k.expires_at),
    strftime('%Y-%m-%d %H:%M:%f', k.created_at),
    CASE WHEN k.state = 'done' THEN strftime('%Y-%m-%d %H:%M:%f', k.created_at) END
FROM idempotency_key k
WHERE NOT EXISTS (SELECT 1 FROM idempotent_request r WHERE r.scope = '' AND r.idem_key = k.idem_key);
DROP TABLE idempotency_key;
`},
}

// qLockOrder reads an order and locks its row until the transaction ends,
// per dialect (store.DB.Pick): SQLite has no row locks, a transaction holds
// the database's write lock from its start.
var qLockOrder = map[string]string{
	store.Postgres: `SELECT status, version FROM orders WHERE id = $1 FOR UPDATE`,
	store.SQLite:   `SELECT status, version FROM orders WHERE id = $1`,
}

// Queries, written once with $n placeholders (store.DB.Q adapts them).
const (
	qInsertOrder = `INSERT INTO orders (id, customer_id, status, fulfilment, fulfilment_rank, version, created_at, updated_at)
VALUES ($1, $2, $3, $4, 0, 1, $5, $6)`
	qGetOrder   = `SELECT id, customer_id, status, fulfilment, COALESCE(pickup_id, ''), version, created_at FROM orders WHERE id = $1`
	qGetLines   = `SELECT product_id, quantity FROM order_line WHERE order_id = $1 ORDER BY line_no`
	qCancel     = `UPDATE orders SET status = $1, version = $2, updated_at = $3 WHERE id = $4`
	qFulfilment = `UPDATE orders SET fulfilment = $1, fulfilment_rank = $2, pickup_id = COALESCE($3, pickup_id), updated_at = $4
WHERE id = $5 AND fulfilment_rank < $6`
)

// insertLines is the insert of an order's n lines in one statement.
func insertLines(n int) string {
	if n < len(insertLinesByCount) {
		return insertLinesByCount[n]
	}
	return renderInsertLines(n)
}

var insertLinesByCount = func() []string {
	qs := make([]string, MaxLines+1)
	for n := 1; n <= MaxLines; n++ {
		qs[n] = renderInsertLines(n)
	}
	return qs
}()

func renderInsertLines(n int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO order_line (order_id, line_no, product_id, quantity) VALUES `)
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "($%d, $%d, $%d, $%d)", 4*i+1, 4*i+2, 4*i+3, 4*i+4)
	}
	return b.String()
}
