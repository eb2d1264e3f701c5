package order

import "github.com/idem-go/idem/shop/store"

// migrations are the order service's own tables, per dialect. The outbox,
// processed_event and failed_message tables are idem's (migrate.Up).
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
`},
}

// Queries, written once with $n placeholders (store.DB.Q adapts them).
const (
	qInsertOrder = `INSERT INTO orders (id, customer_id, status, fulfilment, fulfilment_rank, version, created_at, updated_at)
VALUES ($1, $2, $3, $4, 0, 1, $5, $6)`
	qInsertLine = `INSERT INTO order_line (order_id, line_no, product_id, quantity) VALUES ($1, $2, $3, $4)`
	qGetOrder   = `SELECT id, customer_id, status, fulfilment, COALESCE(pickup_id, ''), version, created_at FROM orders WHERE id = $1`
	qGetLines   = `SELECT product_id, quantity FROM order_line WHERE order_id = $1 ORDER BY line_no`
	qLockOrder  = `SELECT status, version FROM orders WHERE id = $1 FOR UPDATE`
	qCancel     = `UPDATE orders SET status = $1, version = $2, updated_at = $3 WHERE id = $4`
	qFulfilment = `UPDATE orders SET fulfilment = $1, fulfilment_rank = $2, pickup_id = COALESCE($3, pickup_id), updated_at = $4
WHERE id = $5 AND fulfilment_rank < $6`

	qKeyInsert = `INSERT INTO idempotency_key (idem_key, request_hash, state, owner, locked_until, expires_at, created_at)
VALUES ($1, $2, 'processing', $3, $4, $5, $6) ON CONFLICT (idem_key) DO NOTHING`
	qKeyGet = `SELECT request_hash, state, COALESCE(response_status, 0), COALESCE(response_body, ''), locked_until, expires_at
FROM idempotency_key WHERE idem_key = $1`
	qKeyRestart = `UPDATE idempotency_key SET request_hash = $1, state = 'processing', owner = $2, response_status = NULL,
response_body = NULL, locked_until = $3, expires_at = $4, created_at = $5 WHERE idem_key = $6 AND expires_at <= $7`
	qKeyTakeOver = `UPDATE idempotency_key SET owner = $1, locked_until = $2
WHERE idem_key = $3 AND state = 'processing' AND locked_until <= $4`
	qKeyComplete = `UPDATE idempotency_key SET state = 'done', response_status = $1, response_body = $2
WHERE idem_key = $3 AND owner = $4 AND state = 'processing'`
	qKeyRelease = `DELETE FROM idempotency_key WHERE idem_key = $1 AND owner = $2 AND state = 'processing'`
	qKeyPurge   = `DELETE FROM idempotency_key WHERE expires_at <= $1`
)
