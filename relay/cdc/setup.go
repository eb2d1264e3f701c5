package cdc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/relay/internal/logengine"
	"github.com/idem-go/idem/relay/logrelay"
)

// ErrWALLevel is returned (wrapped) by Start when the server does not run
// with wal_level = logical.
var ErrWALLevel = errors.New("idem: cdc: logical replication needs wal_level = logical")

// ErrSlotActive is the error (wrapped) a relay meets while another process
// reads its slot: it waits, and retries.
var ErrSlotActive = errors.New("idem: cdc: the replication slot is active in another process")

// ErrFailoverLoss is returned (wrapped) by Start on a server with a physical
// standby when the slot cannot follow a failover and the outbox may hold
// events that exist only in the WAL: see Config.RowsOnly and
// Config.AcceptFailoverLoss.
var ErrFailoverLoss = errors.New("idem: cdc: a failover to the standby would lose the events not yet published")

// queries holds the relay's statements for its table, publication and slot.
type queries struct {
	table           string // quoted, qualified
	createPub       string
	deleteRows      string
	quarantine      string
	quarantineAfter string
	park            string
	parkTyped       string
	parkUnreadable  string
	publicationHint string
	// archive is the outbox's archive (migration 0013), quoted and
	// qualified; archiveRows and archiveSeqs delete published rows (by id,
	// or by seq for the rows waiting at the slot's creation) and archive
	// the events published, in one statement.
	archive                  string
	archiveRows, archiveSeqs string
	// due reads a page of the delayed rows due at $1; empty on a table
	// without idem's seq, published_at, quarantined_at and not_before
	// columns, where no row is delayed.
	due string
	// doneRows deletes the rows of seqs $1 once published (rows read from
	// the table: delayed, or waiting at the slot's creation), markRows
	// marks them published (KeepRows).
	doneRows, markRows string
}

// The statements that do not depend on the table.
const (
	walLevelSQL    = `SHOW wal_level`
	currentSchema  = `SELECT current_schema()`
	tableExistsSQL = `SELECT to_regclass($1) IS NOT NULL`
	pubExistsSQL   = `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`
	pubHasTableSQL = `SELECT EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3)`
	slotSQL        = `SELECT plugin, database, coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1 AND slot_type = 'logical'`
	dropSlotSQL    = `SELECT pg_drop_replication_slot($1)`
	currentDBSQL   = `SELECT current_database()`
	canDeleteSQL   = `SELECT has_table_privilege($1, 'DELETE')`
	// canArchiveSQL: the archive's inserts, and its purge (a delete that
	// reads the rows it deletes).
	canArchiveSQL = `SELECT has_table_privilege($1, 'SELECT') AND has_table_privilege($1, 'INSERT') AND has_table_privilege($1, 'DELETE')`
	// delayColumnsSQL counts the columns delayed rows need: not_before
	// (migration 0012), and seq, published_at, quarantined_at to read them
	// in order and skip the rows set aside.
	delayColumnsSQL = `SELECT count(*) FROM pg_attribute
	WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped
	AND attname IN ('seq', 'published_at', 'quarantined_at', 'not_before')`
	versionSQL      = `SELECT current_setting('server_version_num')::int`
	slotFailoverSQL = `SELECT failover FROM pg_replication_slots WHERE slot_name = $1`
	// standbysSQL names the physical standbys: walsenders connected to no
	// database (a logical one, a relay's included, has its database; a role
	// without pg_read_all_stats sees their pid and application name), and
	// physical slots.
	standbysSQL = `SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM (
	SELECT 'walsender ' || coalesce(nullif(r.application_name, ''), r.pid::text) AS name
	FROM pg_stat_replication r JOIN pg_stat_activity a ON a.pid = r.pid
	WHERE a.datid IS NULL AND r.state IS DISTINCT FROM 'backup'
	UNION ALL
	SELECT 'physical slot ' || slot_name FROM pg_replication_slots WHERE slot_type = 'physical') AS n`
	slotPositionSQL = `SELECT coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint,
	coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), 0)::bigint
	FROM pg_replication_slots WHERE slot_name = $1`
)

// archiveSQL returns the statement that deletes the published rows of
// table (quoted and qualified; tableName bare) the condition on $1 selects
// and archives the published events given in $2 to
// $11 (one array per column, in the order of publication: the archive's seq
// follows it), at once: a crash leaves both done or neither. An event
// archived already (the slot gave its transaction again after a crash) is
// kept as it was. It returns the rows deleted and the events archived.
func archiveSQL(table, tableName, archive, where string) string {
	return `WITH d AS (DELETE FROM ` + table + ` WHERE ` + where + ` RETURNING 1),
a AS (
    INSERT INTO ` + archive + ` (outbox_table, id, aggregatetype, aggregateid, type, payload, occurred_at, aggregate_version, headers,
        content_type, payload_binary)
    SELECT '` + strings.ReplaceAll(tableName, "'", "''") + `', u.id, u.aggregatetype, u.aggregateid, u.type, u.payload::json, u.occurred_at, u.aggregate_version,
        coalesce(u.headers::json, '{}'), u.content_type, u.payload_binary
    FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::timestamptz[], $8::bigint[], $9::text[], $10::text[], $11::bytea[])
        WITH ORDINALITY AS u(id, aggregatetype, aggregateid, type, payload, occurred_at, aggregate_version, headers, content_type, payload_binary, n)
    ORDER BY u.n
    ON CONFLICT (outbox_table, id) DO NOTHING
    RETURNING 1)
SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM a)`
}

// archiveArgs returns the arguments $2 to $11 of archiveSQL for recs: a
// payload that is not JSON goes to payload_binary, as in the outbox.
func archiveArgs(recs []*driver.OutboxRecord) []any {
	n := len(recs)
	ids, types, aggIDs, names := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	payloads, headers := make([]*string, n), make([]*string, n)
	occurred, versions := make([]time.Time, n), make([]int64, n)
	contentTypes, binaries := make([]*string, n), make([][]byte, n)
	for i, rec := range recs {
		ids[i], types[i], aggIDs[i], names[i] = rec.RawID, rec.AggregateType, rec.AggregateID, rec.Type
		if rec.ContentType != "" {
			ct := rec.ContentType
			contentTypes[i] = &ct
		}
		if !idem.IsJSONContentType(rec.ContentType) {
			binaries[i] = append([]byte{}, rec.Payload...)
		} else if rec.Payload != nil {
			p := string(rec.Payload)
			payloads[i] = &p
		}
		if rec.RawHeaders != nil {
			h := string(rec.RawHeaders)
			headers[i] = &h
		}
		occurred[i], versions[i] = rec.OccurredAt, rec.AggregateVersion
	}
	return []any{ids, types, aggIDs, names, payloads, occurred, versions, headers, contentTypes, binaries}
}

func newQueries(schema, table, archiveTable, publication string) queries {
	t := postgres.QuoteIdent(schema) + "." + postgres.QuoteIdent(table)
	archive := postgres.QuoteIdent(schema) + "." + postgres.QuoteIdent(archiveTable)
	create := fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert')`, postgres.QuoteIdent(publication), t)
	return queries{
		table:     t,
		createPub: create,
		// By the primary key: Debezium's outbox has no seq. The ids are
		// the column's text, and $1 takes the column's type: uuid in
		// idem's outbox, text in another program's (Debezium's article
		// has id VARCHAR(64)).
		deleteRows: `DELETE FROM ` + t + ` WHERE id = ANY($1)`,
		quarantine: `UPDATE ` + t + ` SET quarantined_at = now(), last_error = $2, attempts = attempts + 1 WHERE seq = $1`,
		// A waiting row (the initial sweep) the broker refused $3 times.
		quarantineAfter: `UPDATE ` + t + ` SET quarantined_at = now(), last_error = $2, attempts = attempts + $3 WHERE seq = $1`,
		// A refused message: its row quarantined, or written as a
		// quarantined row when there is none (a WAL message, a row its
		// writer deleted). The insert comes back in the stream, quarantined:
		// the relay skips it. $1 takes the id column's type, as in
		// deleteRows.
		park: `INSERT INTO ` + t + ` AS o (id, aggregatetype, aggregateid, type, payload, occurred_at, aggregate_version, headers, quarantined_at, last_error, attempts)
VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, coalesce($8::jsonb, '{}'), now(), $9, $10)
ON CONFLICT (id) DO UPDATE SET quarantined_at = now(), last_error = excluded.last_error, attempts = excluded.attempts
WHERE o.quarantined_at IS NULL
RETURNING seq`,
		// park for an event with a content type: its payload in
		// payload_binary when it is not JSON ($5 is then NULL).
		parkTyped: `INSERT INTO ` + t + ` AS o (id, aggregatetype, aggregateid, type, payload, occurred_at, aggregate_version, headers, quarantined_at, last_error, attempts,
    content_type, payload_binary)
VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, coalesce($8::jsonb, '{}'), now(), $9, $10, $11, $12::bytea)
ON CONFLICT (id) DO UPDATE SET quarantined_at = now(), last_error = excluded.last_error, attempts = excluded.attempts
WHERE o.quarantined_at IS NULL
RETURNING seq`,
		// A WAL message that cannot become a message: a quarantined row
		// whose last_error holds its content.
		parkUnreadable: `INSERT INTO ` + t + ` (id, aggregatetype, aggregateid, type, payload, quarantined_at, last_error, attempts)
VALUES (gen_random_uuid(), $1, $2, $3, NULL, now(), $4, 1)`,
		publicationHint: create,
		archive:         archive,
		archiveRows:     archiveSQL(t, table, archive, `id = ANY($1)`),
		archiveSeqs:     archiveSQL(t, table, archive, `seq = ANY($1::bigint[])`),
		doneRows:        `DELETE FROM ` + t + ` WHERE seq = ANY($1::bigint[])`,
		markRows:        `UPDATE ` + t + ` SET published_at = now() WHERE seq = ANY($1::bigint[]) AND published_at IS NULL`,
	}
}

// Setup checks the server and creates the publication and the slot.
func (r *source) Setup(ctx context.Context) (logengine.Setup, error) {
	var s logengine.Setup
	err := r.setup(ctx, &s)
	return s, err
}

func (r *source) setup(ctx context.Context, set *logengine.Setup) error {
	pcfg, err := pgxpool.ParseConfig(r.dbURL)
	if err != nil {
		return fmt.Errorf("idem: cdc: database URL: %w", err)
	}
	pcfg.MaxConns = 3 // visibility checks, deletes, and the archive's purge
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("idem: cdc: connect: %w", err)
	}
	r.pool = pool
	r.host = readSigns(ctx, pool).detect()
	var level string
	if err := pool.QueryRow(ctx, walLevelSQL).Scan(&level); err != nil {
		return fmt.Errorf("idem: cdc: connect: %w", err)
	}
	if level != "logical" {
		return fmt.Errorf("%w, and the server runs with wal_level = %s: %s", ErrWALLevel, level, r.host.walLevelHint())
	}
	r.schema = r.cfg.Tables.Schema
	if r.schema == "" {
		if err := pool.QueryRow(ctx, currentSchema).Scan(&r.schema); err != nil {
			return fmt.Errorf("idem: cdc: current schema: %w", err)
		}
	}
	r.sql = newQueries(r.schema, r.cfg.Tables.Outbox, r.cfg.Tables.OutboxArchive, r.cfg.Publication)
	var exists bool
	if err := pool.QueryRow(ctx, tableExistsSQL, r.sql.table).Scan(&exists); err != nil {
		return fmt.Errorf("idem: cdc: look for the outbox: %w", err)
	}
	if !exists {
		return fmt.Errorf("%w: %s (run idem migrate)", idem.ErrMissingTable, r.sql.table)
	}
	var delayCols int
	if err := pool.QueryRow(ctx, delayColumnsSQL, r.sql.table).Scan(&delayCols); err != nil {
		return fmt.Errorf("idem: cdc: read the outbox's columns: %w", err)
	}
	if delayCols == 4 {
		// scheduled_idx (migration 0012) holds exactly these rows.
		r.sql.due = `SELECT * FROM ` + r.sql.table + `
WHERE published_at IS NULL AND not_before IS NOT NULL AND not_before <= $1 AND quarantined_at IS NULL
ORDER BY seq LIMIT ` + fmt.Sprint(logengine.DuePage)
		set.Delayed = true
	}
	if r.cfg.Delete == logrelay.DeletePublished {
		var can bool
		if err := pool.QueryRow(ctx, canDeleteSQL, r.sql.table).Scan(&can); err != nil {
			return fmt.Errorf("idem: cdc: read privileges on %s: %w", r.sql.table, err)
		}
		if !can {
			// Without it the slot's position could never move.
			return fmt.Errorf("idem: cdc: the relay's role cannot delete from %s, which it does once rows are published: GRANT DELETE ON %s TO %s, or leave the rows to their writer (Config.Delete = KeepRows, idem cdc --keep-rows)", r.sql.table, r.sql.table, postgres.QuoteIdent(r.replCfg.User))
		}
	}
	drv, err := postgres.NewPgxTables(pool, idem.Tables{Schema: r.schema, Outbox: r.cfg.Tables.Outbox,
		OutboxArchive: r.cfg.Tables.OutboxArchive, ConsumerPause: r.cfg.Tables.ConsumerPause})
	if err != nil {
		return fmt.Errorf("idem: cdc: %w", err)
	}
	set.Outbox = r.cfg.Tables.Outbox
	if r.cfg.ArchiveRetention > 0 {
		if err := pool.QueryRow(ctx, tableExistsSQL, r.sql.archive).Scan(&exists); err != nil {
			return fmt.Errorf("idem: cdc: look for the outbox's archive: %w", err)
		}
		if !exists {
			return fmt.Errorf("%w: %s, the archive of the events the relay publishes, for idem replay: run idem migrate (migration 0013), or turn the archive off (Config.ArchiveRetention negative, idem cdc --archive-retention 0)", idem.ErrMissingTable, r.sql.archive)
		}
		var can bool
		if err := pool.QueryRow(ctx, canArchiveSQL, r.sql.archive).Scan(&can); err != nil {
			return fmt.Errorf("idem: cdc: read privileges on %s: %w", r.sql.archive, err)
		}
		if !can {
			return fmt.Errorf("idem: cdc: the relay's role cannot write %s, the archive of the events it publishes, for idem replay: GRANT SELECT, INSERT, DELETE ON %s TO %s, or turn the archive off (Config.ArchiveRetention negative, idem cdc --archive-retention 0)",
				r.sql.archive, r.sql.archive, postgres.QuoteIdent(r.replCfg.User))
		}
		set.Archiver = drv.Dialect().(driver.OutboxArchiver)
		set.ArchiveEx = drv.Pool()
	}
	pauses := postgres.QuoteIdent(r.schema) + "." + postgres.QuoteIdent(r.cfg.Tables.ConsumerPause)
	if err := pool.QueryRow(ctx, tableExistsSQL, pauses).Scan(&exists); err != nil {
		return fmt.Errorf("idem: cdc: look for the table of operators' pauses: %w", err)
	}
	if exists {
		ps, err := drv.Dialect().ListPauses(ctx, drv.Pool(), idem.PauseRelay, r.cfg.Tables.Outbox)
		if err != nil {
			// A role without SELECT on the table: the relay runs, and
			// cannot be paused.
			r.log.Warn("cannot read the table of operators' pauses: this relay cannot be paused (idem pause --relay) until its role may: GRANT SELECT ON "+pauses+" TO "+postgres.QuoteIdent(r.replCfg.User),
				"error", err)
		} else {
			set.Pauses, set.PauseEx, set.PauseName = drv.Dialect(), drv.Pool(), r.cfg.Tables.Outbox
			// Paused: the slot, if it is to be created, is created by
			// the first session, once resumed. Its snapshot's rows are
			// published by that session only: a slot created now and a
			// Stop before the resume would leave them unpublished.
			r.slotLater = len(ps) > 0 && ps[0].ActiveAt(r.cfg.Now())
		}
	}
	if err := r.ensurePublication(ctx); err != nil {
		return err
	}
	if err := r.checkFailover(ctx); err != nil {
		return err
	}
	if !r.slotLater {
		if err := r.ensureSlot(ctx); err != nil {
			return err
		}
	}
	// The replication connection needs the REPLICATION attribute and a
	// pg_hba.conf line for it: say so now rather than retry for ever.
	conn, err := pgconn.ConnectConfig(ctx, r.replCfg)
	if err != nil {
		return replicationErrorOn(r.host, err, r.replCfg.User)
	}
	_ = conn.Close(ctx)
	return nil
}

func (r *source) ensurePublication(ctx context.Context) error {
	var exists bool
	if err := r.pool.QueryRow(ctx, pubExistsSQL, r.cfg.Publication).Scan(&exists); err != nil {
		return fmt.Errorf("idem: cdc: look for publication %s: %w", r.cfg.Publication, err)
	}
	if !exists {
		_, err := r.pool.Exec(ctx, r.sql.createPub)
		var pe *pgconn.PgError
		switch {
		case err == nil:
			r.log.Info("created publication", "publication", r.cfg.Publication, "table", r.sql.table)
			return nil
		case errors.As(err, &pe) && pe.Code == "42710": // created meanwhile by another relay
		case errors.As(err, &pe) && pe.Code == "42501":
			return fmt.Errorf("idem: cdc: creating publication %s needs the ownership of %s (%v): have its owner run %q, then start the relay again", r.cfg.Publication, r.sql.table, err, r.sql.publicationHint)
		default:
			return fmt.Errorf("idem: cdc: create publication %s: %w", r.cfg.Publication, err)
		}
	}
	var has bool
	if err := r.pool.QueryRow(ctx, pubHasTableSQL, r.cfg.Publication, r.schema, r.cfg.Tables.Outbox).Scan(&has); err != nil {
		return fmt.Errorf("idem: cdc: read publication %s: %w", r.cfg.Publication, err)
	}
	if !has {
		return fmt.Errorf("idem: cdc: publication %s exists but does not publish %s: run ALTER PUBLICATION %s ADD TABLE %s, or name another publication", r.cfg.Publication, r.sql.table, postgres.QuoteIdent(r.cfg.Publication), r.sql.table)
	}
	return nil
}

func (r *source) ensureSlot(ctx context.Context) error {
	var plugin, db, walStatus, current string
	err := r.pool.QueryRow(ctx, slotSQL, r.cfg.Slot).Scan(&plugin, &db, &walStatus)
	if err == nil && walStatus == "lost" {
		return fmt.Errorf("idem: cdc: slot %s was invalidated: the WAL it kept exceeded max_slot_wal_keep_size, and the events written past it are lost to it; drop it (idem cdc drop-slot), start the relay again, and replay what was missed from your own records", r.cfg.Slot)
	}
	if err == nil {
		if err := r.pool.QueryRow(ctx, currentDBSQL).Scan(&current); err != nil {
			return fmt.Errorf("idem: cdc: current database: %w", err)
		}
		if plugin != "pgoutput" || db != current {
			return fmt.Errorf("idem: cdc: slot %s exists with plugin %s on database %s; the relay needs a pgoutput slot on %s: name another slot (--slot)", r.cfg.Slot, plugin, db, current)
		}
		return nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("idem: cdc: look for slot %s: %w", r.cfg.Slot, err)
	}
	return r.createSlot(ctx)
}

// createSlot creates the slot over a replication connection, exporting the
// snapshot of its consistent point: the rows visible in it are exactly those
// the slot will never stream. When the outbox may hold waiting rows
// (initialRowsQuery), a transaction of the pool imports the snapshot only
// to read the highest seq waiting in it, and ends: the rows waiting up to
// that seq, kept in r.initial, are published first by the reading
// goroutine, read outside any transaction. One held while they are
// published would keep the outbox's lock, and an ALTER TABLE waiting for
// it would stop every writer of the outbox, the relay's deletes included.
func (r *source) createSlot(ctx context.Context) error {
	conn, err := pgconn.ConnectConfig(ctx, r.replCfg)
	if err != nil {
		return replicationErrorOn(r.host, err, r.replCfg.User)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	res, err := pglogrepl.ParseCreateReplicationSlot(conn.Exec(ctx, createSlotCommand(r.cfg.Slot, serverVersion(conn))))
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42710" { // created meanwhile by another relay
		return nil
	}
	if err != nil {
		return slotErrorOn(r.host, err, r.cfg.Slot, r.replCfg.User)
	}
	r.log.Info("created replication slot; it keeps the WAL from here on until it is dropped (idem cdc drop-slot)", "lsn", res.ConsistentPoint)
	where, err := r.initialRowsWhere(ctx)
	if err != nil || where == "" {
		return err
	}
	// The snapshot lives while the replication connection is open and idle:
	// import it now.
	tx, err := r.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("idem: cdc: read the rows waiting in the outbox: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT '"+strings.ReplaceAll(res.SnapshotName, "'", "''")+"'"); err != nil {
		return fmt.Errorf("idem: cdc: read the rows waiting in the outbox: import the slot's snapshot: %w", err)
	}
	var last *int64
	if err := tx.QueryRow(ctx, `SELECT max(seq) FROM `+r.sql.table+` WHERE`+where).Scan(&last); err != nil {
		return fmt.Errorf("idem: cdc: read the rows waiting in the outbox: %w", err)
	}
	if last != nil {
		r.initial = newInitialRows(r, where, *last)
	}
	return nil
}

// failoverSlotsVersion is the first server_version_num whose logical
// slots can follow a failover (CREATE_REPLICATION_SLOT's FAILOVER option,
// synchronized to standbys with sync_replication_slots).
const failoverSlotsVersion = 170000

// createSlotCommand returns the replication command creating the relay's
// slot with an exported snapshot, on a server of version (its
// server_version_num): with FAILOVER from PostgreSQL 17 on, so that a
// standby that synchronizes slots (sync_replication_slots = on) has it
// after a promotion.
func createSlotCommand(slot string, version int) string {
	if version >= failoverSlotsVersion {
		return "CREATE_REPLICATION_SLOT " + slot + " LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER true)"
	}
	return "CREATE_REPLICATION_SLOT " + slot + " LOGICAL pgoutput EXPORT_SNAPSHOT"
}

// serverVersion returns the server_version_num of a connection, from its
// server_version parameter ("15.4", "17.0 (Debian 17.0-1)", "9.6.24"), or 0.
func serverVersion(conn *pgconn.PgConn) int {
	return parseServerVersion(conn.ParameterStatus("server_version"))
}

func parseServerVersion(v string) int {
	v, _, _ = strings.Cut(v, " ")
	parts := strings.SplitN(v, ".", 3)
	var n [3]int
	for i, p := range parts {
		end := strings.IndexFunc(p, func(r rune) bool { return r < '0' || r > '9' })
		if end >= 0 {
			p = p[:end]
		}
		x, err := strconv.Atoi(p)
		if err != nil {
			break
		}
		n[i] = x
	}
	if n[0] >= 10 {
		return n[0]*10000 + n[1]
	}
	return n[0]*10000 + n[1]*100 + n[2]
}

// checkFailover refuses a start that a failover to a physical standby
// would cost events: the server has one, the slot cannot follow a failover
// (PostgreSQL before 17, or an existing slot created without failover), and
// the outbox may hold events that exist only in the WAL (not
// Config.RowsOnly), unless Config.AcceptFailoverLoss.
func (r *source) checkFailover(ctx context.Context) error {
	if r.cfg.AcceptFailoverLoss {
		return nil
	}
	var standbys []string
	if err := r.pool.QueryRow(ctx, standbysSQL).Scan(&standbys); err != nil {
		return fmt.Errorf("idem: cdc: look for physical standbys: %w", err)
	}
	if len(standbys) == 0 {
		return nil
	}
	if r.cfg.RowsOnly {
		// The rows wait in the table: a new slot's first sweep publishes
		// them, which needs idem's columns.
		var cols int
		if err := r.pool.QueryRow(ctx, sweepColumnsSQL, r.sql.table).Scan(&cols); err != nil {
			return fmt.Errorf("idem: cdc: read the outbox's columns: %w", err)
		}
		if cols == 3 {
			return nil
		}
		return fmt.Errorf("%w: the server has a physical standby (%s), and Config.RowsOnly (--rows-only) needs idem's seq, published_at and quarantined_at columns in %s to publish the rows waiting after a failover, which creates slot %s again: run idem migrate on the table, or accept the loss (Config.AcceptFailoverLoss, --accept-failover-loss)",
			ErrFailoverLoss, strings.Join(standbys, ", "), r.sql.table, r.cfg.Slot)
	}
	var version int
	if err := r.pool.QueryRow(ctx, versionSQL).Scan(&version); err != nil {
		return fmt.Errorf("idem: cdc: server version: %w", err)
	}
	if version >= failoverSlotsVersion {
		failover := true // a slot created now has it
		err := r.pool.QueryRow(ctx, slotFailoverSQL, r.cfg.Slot).Scan(&failover)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("idem: cdc: read slot %s: %w", r.cfg.Slot, err)
		}
		if failover {
			return nil
		}
		return fmt.Errorf("%w: the server has a physical standby (%s) and slot %s was created without failover, so a standby will not have it after a promotion; the WAL messages and the rows deleted by their writer (or kept with --keep-rows) that are not published then are lost, and the relay cannot tell which: drop the slot while no event waits (idem cdc drop-slot) and start the relay again, which creates it with failover (then set sync_replication_slots = on, hot_standby_feedback = on and primary_slot_name on the standby, and synchronized_standby_slots on the primary); or, when every event is a row the relay deletes, say so (Config.RowsOnly, --rows-only); or accept the loss (Config.AcceptFailoverLoss, --accept-failover-loss)",
			ErrFailoverLoss, strings.Join(standbys, ", "), r.cfg.Slot)
	}
	return fmt.Errorf("%w: the server has a physical standby (%s), and before PostgreSQL 17 a standby has no copy of the logical slot: after a promotion the relay creates slot %s again and publishes the rows still in the outbox table, but the WAL messages (outbox.NewLogWriter) and the rows deleted by their writer (or kept with --keep-rows) that were not published then are lost, and the relay cannot tell which. When every event of this outbox is a row the relay deletes, say so (Config.RowsOnly, idem cdc --rows-only); otherwise move to PostgreSQL 17 with failover slots, write the events as rows, or accept the loss (Config.AcceptFailoverLoss, --accept-failover-loss)",
		ErrFailoverLoss, strings.Join(standbys, ", "), r.cfg.Slot)
}

// recreateSlot creates the slot again when a session found it missing:
// after a failover to a standby that had no copy of it, or a drop. The rows
// still in the table are published first, like those waiting at the first
// start (some again: consumers deduplicate); what existed only in the WAL
// since the last confirmed position is lost, and the log says so.
func (r *source) recreateSlot(missing error) error {
	ctx, cancel := context.WithTimeout(r.eng.Context(), r.cfg.QueryTimeout)
	defer cancel()
	if err := r.checkFailover(ctx); err != nil {
		return err
	}
	if err := r.ensureSlot(ctx); err != nil {
		return err
	}
	r.log.Warn("the replication slot was missing (a failover to a standby that had no copy of it, or a drop) and is created again: the rows still in the outbox table are published first (some again: consumers deduplicate); the WAL messages, and the rows deleted by their writer or kept with KeepRows, that were not published before now are lost to the relay",
		"rows_only", r.cfg.RowsOnly, "accept_failover_loss", r.cfg.AcceptFailoverLoss, "error", missing)
	return nil
}

// slotErrorOn explains the errors of slot statements on host.
func slotErrorOn(host managedServer, err error, slot, user string) error {
	if err == nil {
		return nil
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "42704": // undefined_object
			return fmt.Errorf("%w: replication slot %s (%s)", idem.ErrNotFound, slot, pe.Message)
		case "55006": // object_in_use
			return fmt.Errorf("%w: slot %s: %s (stop that relay first)", ErrSlotActive, slot, pe.Message)
		case "53400": // configuration_limit_exceeded
			return fmt.Errorf("idem: cdc: cannot create slot %s: %s: every replication slot is taken; drop the slots no one reads (SELECT slot_name FROM pg_replication_slots WHERE NOT active; idem cdc drop-slot), or %s", slot, pe.Message, host.slotsHint())
		case "55000": // object_not_in_prerequisite_state: wal_level, mostly
			return fmt.Errorf("idem: cdc: slot %s: %s: %s", slot, pe.Message, host.walLevelHint())
		case "42501": // insufficient_privilege
			return fmt.Errorf("idem: cdc: slot %s: %s: %s", slot, pe.Message, host.replicationHint(user))
		}
	}
	return fmt.Errorf("idem: cdc: slot %s: %w", slot, err)
}

// replicationErrorOn explains a failed replication connection to host.
func replicationErrorOn(host managedServer, err error, user string) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "42501":
			return fmt.Errorf("idem: cdc: replication connection refused: %s: %s", pe.Message, host.replicationHint(user))
		case "28000", "28P01":
			return fmt.Errorf("idem: cdc: replication connection refused: %s: %s", pe.Message, host.hbaHint(user))
		}
	}
	return fmt.Errorf("idem: cdc: replication connection: %w", err)
}
