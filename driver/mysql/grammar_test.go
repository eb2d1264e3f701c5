package mysql_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// notOnMySQL are constructs MariaDB accepts and MySQL 8.0 or 8.4 refuses (or
// reads otherwise): the polling dialect's SQL must use none of them, since
// it is tested on MariaDB only (docs/ARCHITECTURE.md, "MySQL 8
// compatibility"). Each has the reason and a statement it must catch.
var notOnMySQL = []struct {
	re, reason, example string
}{
	{`\bRETURNING\b`,
		"INSERT/REPLACE/DELETE ... RETURNING is MariaDB's (10.5+); MySQL has no RETURNING: read the row back, or use LAST_INSERT_ID()",
		"DELETE FROM t WHERE id = ? RETURNING seq"},
	{`\b(ADD|DROP|MODIFY|CHANGE|RENAME)\s+(COLUMN\s+|INDEX\s+|KEY\s+|CONSTRAINT\s+|PARTITION\s+|FOREIGN\s+KEY\s+|UNIQUE\s+(KEY\s+|INDEX\s+)?)?IF\s+(NOT\s+)?EXISTS\b`,
		"IF [NOT] EXISTS inside ALTER TABLE is MariaDB's; MySQL refuses it (a migration runs once: it needs none)",
		"ALTER TABLE t ADD COLUMN IF NOT EXISTS c INT"},
	{`\b(CREATE\s+(UNIQUE\s+)?INDEX|DROP\s+INDEX)\s+IF\s+(NOT\s+)?EXISTS\b`,
		"CREATE INDEX IF NOT EXISTS and DROP INDEX IF EXISTS are MariaDB's; MySQL refuses them",
		"DROP INDEX IF EXISTS i ON t"},
	{`\bCREATE\s+OR\s+REPLACE\s+(TABLE|INDEX|DATABASE|SCHEMA|USER|ROLE|SEQUENCE|TRIGGER|PROCEDURE|FUNCTION|EVENT)\b`,
		"CREATE OR REPLACE is MariaDB's but for views; MySQL has CREATE OR REPLACE VIEW only",
		"CREATE OR REPLACE TABLE t (id INT)"},
	{`\b(SEQUENCE|NEXTVAL|LASTVAL|SETVAL|NEXT\s+VALUE\s+FOR|PREVIOUS\s+VALUE\s+FOR)\b`,
		"sequences are MariaDB's (10.3+); MySQL has AUTO_INCREMENT only",
		"SELECT NEXTVAL(s)"},
	{`\bVALUE\s*\(`,
		"VALUE() (singular) in ON DUPLICATE KEY UPDATE is MariaDB's synonym; MySQL knows VALUES() only",
		"INSERT INTO t (a) VALUES (?) ON DUPLICATE KEY UPDATE a = VALUE(a)"},
	{`\bAS\s+\w+\s+ON\s+DUPLICATE\s+KEY\b`,
		"the row alias of INSERT ... AS new ON DUPLICATE KEY UPDATE is MySQL's (8.0.19+); MariaDB refuses it: use VALUES(col), which both accept (deprecated on MySQL 8.0.20+, a warning)",
		"INSERT INTO t (a) VALUES (?) AS new ON DUPLICATE KEY UPDATE a = new.a"},
	{`\bSET\s+STATEMENT\b`,
		"SET STATEMENT ... FOR is MariaDB's; MySQL has the SET_VAR optimizer hint instead",
		"SET STATEMENT max_statement_time = 1 FOR SELECT 1"},
	{`\b(FOR\s+UPDATE|LOCK\s+IN\s+SHARE\s+MODE)\s+WAIT\s+\d`,
		"FOR UPDATE WAIT n is MariaDB's; MySQL has NOWAIT and innodb_lock_wait_timeout",
		"SELECT 1 FROM t FOR UPDATE WAIT 5"},
	{`\bFOR\s+SHARE\b`,
		"FOR SHARE is MySQL's (8.0.1+) and MariaDB 10.11 refuses it: LOCK IN SHARE MODE, which MySQL 8.0 and 8.4 still accept, is the form both take",
		"SELECT 1 FROM t WHERE id = ? FOR SHARE"},
	{`\bDEFAULT\s+(UTC_TIMESTAMP|UTC_DATE|UUID|CURDATE|RAND|CONCAT|JSON_\w+)\s*\(`,
		"an expression default must be in parentheses on MySQL (DEFAULT (UTC_TIMESTAMP(6)), 8.0.13+); MariaDB also takes it bare. CURRENT_TIMESTAMP(n) is the only function both take bare",
		"created_at DATETIME(6) NOT NULL DEFAULT UTC_TIMESTAMP(6)"},
	{`\b(JSON|(TINY|MEDIUM|LONG)?(TEXT|BLOB))\b[^,\n]*\bDEFAULT\s+['"\d]`,
		"a literal default on a JSON, TEXT or BLOB column is MariaDB's; MySQL takes only an expression default there (DEFAULT ('{}'), 8.0.13+)",
		"headers JSON NOT NULL DEFAULT '{}'"},
	{`\bIN\s*\(\s*SELECT\b[^()]*\bLIMIT\b`,
		"LIMIT in an IN (SELECT ...) subquery: MySQL refuses it (ER_NOT_SUPPORTED_YET), as MariaDB does; wrap it in a derived table",
		"DELETE FROM t WHERE id IN (SELECT id FROM t ORDER BY id LIMIT 10)"},
	{`\b(EXCEPT|INTERSECT)\b`,
		"EXCEPT and INTERSECT came in MySQL 8.0.31: older 8.0 servers refuse them",
		"SELECT a FROM t EXCEPT SELECT a FROM u"},
	{`\bJSON_(EXISTS|QUERY|VALID_SCHEMA|DETAILED|LOOSE|COMPACT|EQUALS|NORMALIZE|ARRAY_INTERSECT|KEY_VALUE|OBJECT_FILTER_KEYS|OBJECT_TO_ARRAY)\s*\(`,
		"these JSON functions are MariaDB's; MySQL has JSON_CONTAINS_PATH, JSON_EXTRACT, JSON_OVERLAPS and others instead",
		"SELECT JSON_QUERY(headers, '$.a') FROM t"},
	{`\bJSON_MERGE\s*\(`,
		"JSON_MERGE is deprecated on MySQL (8.0.3) and MariaDB: JSON_MERGE_PRESERVE",
		"SELECT JSON_MERGE(a, b) FROM t"},
	{`\bALGORITHM\s*=\s*NOCOPY\b`,
		"ALGORITHM=NOCOPY is MariaDB's; MySQL has INPLACE and INSTANT",
		"ALTER TABLE t ADD COLUMN c INT, ALGORITHM=NOCOPY"},
	{`\b(INET4|INET6|XMLTYPE)\b|\bUUID\s+(NOT\s+)?NULL\b`,
		"the INET4, INET6 and UUID column types are MariaDB's (10.7+)",
		"CREATE TABLE t (id UUID NOT NULL)"},
	{`\bROWS\s+EXAMINED\b`,
		"LIMIT ROWS EXAMINED is MariaDB's",
		"SELECT * FROM t LIMIT ROWS EXAMINED 100"},
	{`\b(tx_isolation|tx_read_only)\b`,
		"@@tx_isolation and @@tx_read_only were removed in MySQL 8.0: transaction_isolation, or SET SESSION TRANSACTION",
		"SELECT @@tx_isolation"},
	{`\bSHOW\s+(MASTER|SLAVE)\s+STATUS\b|\bSHOW\s+BINLOG\s+STATUS\b`,
		"SHOW MASTER STATUS and SHOW SLAVE STATUS are gone from MySQL 8.4 (SHOW BINARY LOG STATUS, SHOW REPLICA STATUS); SHOW BINLOG STATUS is MariaDB's",
		"SHOW MASTER STATUS"},
	{`\b(BINLOG_GTID_POS|gtid_binlog_pos|gtid_current_pos|gtid_slave_pos|log_bin_compress)\b`,
		"MariaDB's GTIDs and binlog settings: MySQL's are gtid_executed and others; the polling dialect reads no binlog",
		"SELECT @@gtid_binlog_pos"},
	{`\bINNODB_(LOCKS|LOCK_WAITS)\b`,
		"information_schema.INNODB_LOCKS and INNODB_LOCK_WAITS are gone from MySQL 8.0 (performance_schema.data_locks); INNODB_TRX is on both",
		"SELECT * FROM information_schema.INNODB_LOCK_WAITS"},
}

// polling are the places that hold the SQL the polling dialect sends to
// MySQL and MariaDB: its own package and the packages whose statements it
// renders (sqlbase, dialectkit's shared builders, versioned upserts).
var polling = []string{".", "../internal/sqlbase", "../internal/dialectkit", "../internal/versioned", "../internal/failrow"}

// TestNoMariaDBOnlySQL: none of the polling dialect's statements, nor its
// migrations, uses a construct of notOnMySQL. Go string literals are read
// (comments may name the constructs); SQL files without their comments.
func TestNoMariaDBOnlySQL(t *testing.T) {
	res := make([]*regexp.Regexp, len(notOnMySQL))
	for i, d := range notOnMySQL {
		res[i] = regexp.MustCompile(`(?i)` + d.re)
		if !res[i].MatchString(d.example) {
			t.Errorf("the rule %q does not catch its example %q", d.re, d.example)
		}
	}
	texts := sqlTexts(t)
	if len(texts) < 100 {
		t.Fatalf("read %d SQL texts: the places to read have moved", len(texts))
	}
	for where, text := range texts {
		for i, re := range res {
			if m := re.FindString(text); m != "" {
				t.Errorf("%s: %q: %s", where, m, notOnMySQL[i].reason)
			}
		}
	}
}

// TestMigrationsPinCollation: every table the dialect creates (its
// migrations, its table of applied versions) names utf8mb4_bin, and so does
// every column given a character set. A table without it takes the
// database's default collation, which on MySQL 8 is utf8mb4_0900_ai_ci:
// case- and accent-insensitive, and NO PAD where MariaDB's are PAD SPACE, so
// ids and names would compare otherwise than on MariaDB.
func TestMigrationsPinCollation(t *testing.T) {
	create := regexp.MustCompile(`(?is)CREATE\s+TABLE\s+[^;]*?\)\s*(ENGINE[^;]*?)\s*(;|\z)`)
	text := regexp.MustCompile(`(?i)(VARCHAR|CHAR|TEXT|JSON)`)
	charset := regexp.MustCompile(`(?i)CHARACTER\s+SET\s+utf8mb4\b[^,;\n]*`)
	tables := 0
	for where, sql := range sqlTexts(t) {
		for _, m := range create.FindAllStringSubmatch(sql, -1) {
			tables++
			if !text.MatchString(m[0]) {
				continue // no text column (the claim lock's table)
			}
			if !strings.Contains(m[1], "DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin") {
				t.Errorf("%s: a table without DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin: %s", where, m[1])
			}
		}
		for _, m := range charset.FindAllString(sql, -1) {
			if !strings.Contains(m, "COLLATE utf8mb4_bin") {
				t.Errorf("%s: a utf8mb4 column without COLLATE utf8mb4_bin: %s", where, m)
			}
		}
	}
	if tables < 11 {
		t.Fatalf("found %d CREATE TABLE statements: the pattern no longer matches the dialect's", tables)
	}
}

// sqlTexts returns the string literals of the Go files (tests left out) of
// polling, with the literals of a concatenation joined, and the migrations
// without comments, keyed by where they come from.
func sqlTexts(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	fset := token.NewFileSet()
	for _, dir := range polling {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			file, err := parser.ParseFile(fset, f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(file, func(n ast.Node) bool {
				switch e := n.(type) {
				case *ast.BinaryExpr:
					if e.Op != token.ADD {
						return true
					}
				case *ast.BasicLit:
					if e.Kind != token.STRING {
						return true
					}
				default:
					return true
				}
				s, err := concat(n.(ast.Expr))
				if err != nil {
					t.Fatalf("%s: %v", fset.Position(n.Pos()), err)
				}
				out[fset.Position(n.Pos()).String()] = s
				return false
			})
		}
	}
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		out[f] = withoutComments(readFile(t, f))
	}
	return out
}

// concat returns the text of a string literal or of a concatenation, its
// other operands (names, calls) written as "x".
func concat(e ast.Expr) (string, error) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "x", nil
		}
		return strconv.Unquote(e.Value)
	case *ast.ParenExpr:
		return concat(e.X)
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "x", nil
		}
		l, err := concat(e.X)
		if err != nil {
			return "", err
		}
		r, err := concat(e.Y)
		return l + r, err
	}
	return "x", nil
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// withoutComments removes the SQL comments (-- to the end of the line).
func withoutComments(sql string) string {
	lines := strings.Split(sql, "\n")
	for i, l := range lines {
		if j := strings.Index(l, "--"); j >= 0 {
			lines[i] = l[:j]
		}
	}
	return strings.Join(lines, "\n")
}
