package mysql

import (
	"context"
	"time"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/internal/dialectkit"
	"github.com/idem-go/idem/driver/internal/sqlbase"
	"github.com/idem-go/idem/driver/internal/sqltime"
)

var _ driver.OutboxArchiver = (*dialect)(nil)

// archiveQueries are the statements on the outbox's archive (migration
// 0013), which the binlog relay writes (relay/binlog) and "idem replay"
// reads.
type archiveQueries struct {
	info, counts, rows, purge string
}

// archiveColumns are the archive's columns in outboxcodec.ScanRow's order:
// the archive's seq stands for the outbox's, published_at for created_at,
// and no attempt failed.
const archiveColumns = `a.id, a.aggregatetype, a.aggregateid, a.type, a.payload, a.occurred_at,
    a.aggregate_version, a.headers, a.seq, a.published_at, 0, a.content_type, a.payload_binary`

// archiveWhere selects the archived events of the outbox table name (an
// SQL literal) by period, event name and aggregate type (archiveArgs),
// leaving out those still in the outbox as published
// rows (the outbox's replay takes them).
func archiveWhere(outbox, name string) string {
	return `a.outbox_table = ` + name + `
  AND (? IS NULL OR a.occurred_at >= ?)
  AND (? IS NULL OR a.occurred_at < ?)
  AND (? = '' OR a.type = ?)
  AND (? = '' OR a.aggregatetype = ?)
  AND NOT EXISTS (SELECT 1 FROM ` + outbox + ` o WHERE o.id = a.id AND o.published_at IS NOT NULL)`
}

// newArchiveQueries returns the statements on the archive of the outbox
// table outboxName (qualified and quoted: outbox). Table names are plain
// identifiers (idem.Tables.Validate): no quote to escape.
func newArchiveQueries(outbox, outboxName, archive string) archiveQueries {
	name := "'" + outboxName + "'"
	mine := ` WHERE outbox_table = ` + name
	return archiveQueries{
		info: `SELECT (SELECT MIN(published_at) FROM ` + archive + mine + `), (SELECT MAX(published_at) FROM ` + archive + mine + `),
    (SELECT MIN(occurred_at) FROM ` + archive + mine + `)`,
		counts: `SELECT a.type, COUNT(*) FROM ` + archive + ` a
WHERE ` + archiveWhere(outbox, name) + `
GROUP BY a.type
ORDER BY a.type`,
		rows: `SELECT ` + archiveColumns + ` FROM ` + archive + ` a
WHERE ` + archiveWhere(outbox, name) + `
  AND a.seq > ?
ORDER BY a.seq
LIMIT ?`,
		purge: `DELETE FROM ` + archive + mine + ` AND published_at < ?
ORDER BY published_at
LIMIT ?`,
	}
}

func archiveArgs(f driver.ReplayFilter) []any {
	since, until := sqltime.Arg(f.Since), sqltime.Arg(f.Until)
	return []any{since, since, until, until, f.EventName, f.EventName, f.AggregateType, f.AggregateType}
}

// ArchiveInfo implements driver.OutboxArchiver.
func (d *dialect) ArchiveInfo(ctx context.Context, ex driver.Executor) (driver.ArchiveInfo, error) {
	var info driver.ArchiveInfo
	// NULL (an empty archive) scans as the zero time.
	err := driver.QueryRow(ctx, ex, d.aq.info, nil, sqlbase.TimeDest(&info.OldestPublished),
		sqlbase.TimeDest(&info.NewestPublished), sqlbase.TimeDest(&info.OldestOccurred))
	if isMissingTable(err) {
		return driver.ArchiveInfo{}, nil
	}
	if err != nil {
		return driver.ArchiveInfo{}, d.Wrap(err)
	}
	info.Exists, info.Empty = true, info.OldestPublished.IsZero()
	return info, nil
}

// ArchiveCounts implements driver.OutboxArchiver.
func (d *dialect) ArchiveCounts(ctx context.Context, ex driver.Executor, f driver.ReplayFilter) (map[string]int64, error) {
	out, err := dialectkit.QueryCounts(ctx, ex, d.aq.counts, archiveArgs(f))
	return out, d.Wrap(err)
}

// ArchiveRows implements driver.OutboxArchiver.
func (d *dialect) ArchiveRows(ctx context.Context, ex driver.Executor, f driver.ReplayFilter, afterSeq int64, limit int) ([]driver.OutboxRecord, error) {
	out, err := dialectkit.QueryRecords(ctx, ex, d.aq.rows, append(archiveArgs(f), afterSeq, limit), sqlbase.TimeDest)
	return out, d.Wrap(err)
}

// PurgeArchive implements driver.OutboxArchiver.
func (d *dialect) PurgeArchive(ctx context.Context, ex driver.Executor, before time.Time, limit int) (int64, error) {
	n, err := ex.Exec(ctx, d.aq.purge, sqltime.Format(before), limit)
	return n, d.Wrap(err)
}
