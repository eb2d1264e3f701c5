package postgres

import (
	"context"
	"strings"
	"time"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/dialectkit"
)

// archiveQueries are the statements on the outbox's archive (migration
// 0013), which the CDC relay writes (relay/cdc) and "idem replay" reads.
type archiveQueries struct {
	info, counts, rows, purge string
}

// archiveColumns are the archive's columns in outboxcodec.ScanRow's order:
// the archive's seq stands for the outbox's, published_at for created_at,
// and no attempt failed.
const archiveColumns = `a.id, a.aggregatetype, a.aggregateid, a.type, a.payload::text, a.occurred_at,
    a.aggregate_version, a.headers::text, a.seq, a.published_at, 0, a.content_type, a.payload_binary`

// archiveWhere selects the archived events of the outbox table name (an
// SQL literal) by period ($1, $2), event name ($3) and aggregate type ($4),
// leaving out those still in the outbox as
// published rows (the outbox's replay takes them). The outbox's id is a
// uuid: an archived id that is not one in its text form cannot be there.
func archiveWhere(outbox, name string) string {
	return `a.outbox_table = ` + name + `
  AND ($1::timestamptz IS NULL OR a.occurred_at >= $1::timestamptz)
  AND ($2::timestamptz IS NULL OR a.occurred_at < $2::timestamptz)
  AND ($3::text = '' OR a.type = $3::text)
  AND ($4::text = '' OR a.aggregatetype = $4::text)
  AND NOT EXISTS (SELECT 1 FROM ` + outbox + ` o
    WHERE o.id = CASE WHEN a.id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN a.id::uuid END
      AND o.published_at IS NOT NULL)`
}

// newArchiveQueries returns the statements on the archive of the outbox
// table outboxName (qualified and quoted: outbox).
func newArchiveQueries(outbox, outboxName, archive string) archiveQueries {
	name := "'" + strings.ReplaceAll(outboxName, "'", "''") + "'"
	mine := ` WHERE outbox_table = ` + name
	return archiveQueries{
		info: `SELECT (SELECT min(published_at) FROM ` + archive + mine + `), (SELECT max(published_at) FROM ` + archive + mine + `),
    (SELECT min(occurred_at) FROM ` + archive + mine + `)`,
		counts: `SELECT a.type, count(*) FROM ` + archive + ` a
WHERE ` + archiveWhere(outbox, name) + `
GROUP BY a.type
ORDER BY a.type`,
		rows: `SELECT ` + archiveColumns + ` FROM ` + archive + ` a
WHERE ` + archiveWhere(outbox, name) + `
  AND a.seq > $5
ORDER BY a.seq
LIMIT $6`,
		purge: `DELETE FROM ` + archive + mine + ` AND id IN (
    SELECT id FROM ` + archive + mine + ` AND published_at < $1
    ORDER BY published_at
    LIMIT $2)`,
	}
}

// ArchiveInfo implements driver.OutboxArchiver.
func (d *dialect) ArchiveInfo(ctx context.Context, ex driver.Executor) (driver.ArchiveInfo, error) {
	var oldest, newest, occurred *time.Time
	err := driver.QueryRow(ctx, ex, d.aq.info, nil, &oldest, &newest, &occurred)
	if isMissingTable(err) {
		return driver.ArchiveInfo{}, nil
	}
	if err != nil {
		return driver.ArchiveInfo{}, d.Wrap(err)
	}
	info := driver.ArchiveInfo{Exists: true, Empty: oldest == nil}
	if oldest != nil {
		info.OldestPublished, info.NewestPublished, info.OldestOccurred = *oldest, *newest, *occurred
	}
	return info, nil
}

// ArchiveCounts implements driver.OutboxArchiver.
func (d *dialect) ArchiveCounts(ctx context.Context, ex driver.Executor, f driver.ReplayFilter) (map[string]int64, error) {
	out, err := dialectkit.QueryCounts(ctx, ex, d.aq.counts, replayArgs(f))
	return out, d.Wrap(err)
}

// ArchiveRows implements driver.OutboxArchiver.
func (d *dialect) ArchiveRows(ctx context.Context, ex driver.Executor, f driver.ReplayFilter, afterSeq int64, limit int) ([]driver.OutboxRecord, error) {
	out, err := dialectkit.QueryRecords(ctx, ex, d.aq.rows, append(replayArgs(f), afterSeq, limit), nil)
	return out, d.Wrap(err)
}

// PurgeArchive implements driver.OutboxArchiver.
func (d *dialect) PurgeArchive(ctx context.Context, ex driver.Executor, before time.Time, limit int) (int64, error) {
	n, err := ex.Exec(ctx, d.aq.purge, before, limit)
	return n, d.Wrap(err)
}

var _ driver.OutboxArchiver = (*dialect)(nil)
