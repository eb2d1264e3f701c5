package postgres

import (
	"time"

	"github.com/idem-go/idem/driver/internal/dialectkit"
)

// newPauseSQL returns the statements of the operators' pauses (migration
// 0015) on the quoted, qualified table t.
func newPauseSQL(t string) dialectkit.PauseSQL {
	return dialectkit.PauseSQL{
		Upsert: `INSERT INTO ` + t + ` (kind, name, starts_at, ends_at, reason, paused_by, paused_at)
VALUES ($1, $2, $3, $4, $5, $6, COALESCE($7::timestamptz, now()))
ON CONFLICT (kind, name) DO UPDATE SET
    starts_at = excluded.starts_at, ends_at = excluded.ends_at, reason = excluded.reason,
    paused_by = excluded.paused_by, paused_at = excluded.paused_at`,
		Delete: `DELETE FROM ` + t + ` WHERE kind = $1 AND name = $2`,
		List: `SELECT kind, name, starts_at, ends_at, reason, paused_by, paused_at FROM ` + t + `
WHERE ($1::text = '' OR kind = $2) AND ($3::text = '' OR name = $4)
ORDER BY kind, name`,
		TimeArg: func(t time.Time) any {
			if t.IsZero() {
				return nil
			}
			return t
		},
		TimeDest: dialectkit.NullTime,
	}
}
