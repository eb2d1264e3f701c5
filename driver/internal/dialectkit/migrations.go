package dialectkit

import (
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/idem-go/idem/driver"
)

// LoadMigrations reads NNNN_name.up.sql and NNNN_name.down.sql files from dir
// in fsys, renders them as text/template with data and funcs, and returns them
// in version order. Dialect packages call it on their embedded files.
func LoadMigrations(fsys fs.FS, dir string, data any, funcs template.FuncMap) ([]driver.Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	byVersion := map[int]*driver.Migration{}
	for _, e := range entries {
		name := e.Name()
		var up bool
		switch {
		case strings.HasSuffix(name, ".up.sql"):
			up = true
		case strings.HasSuffix(name, ".down.sql"):
		default:
			continue
		}
		prefix, rest, ok := strings.Cut(name, "_")
		version, err := strconv.Atoi(prefix)
		if !ok || err != nil {
			return nil, fmt.Errorf("idem: migration file %s: name must start with a number and _", name)
		}
		raw, err := fs.ReadFile(fsys, path.Join(dir, name))
		if err != nil {
			return nil, err
		}
		tmpl, err := template.New(name).Funcs(funcs).Option("missingkey=error").Parse(string(raw))
		if err != nil {
			return nil, fmt.Errorf("idem: migration file %s: %w", name, err)
		}
		var b strings.Builder
		if err := tmpl.Execute(&b, data); err != nil {
			return nil, fmt.Errorf("idem: migration file %s: %w", name, err)
		}
		m := byVersion[version]
		if m == nil {
			m = &driver.Migration{Version: version}
			byVersion[version] = m
		}
		m.Name = strings.TrimSuffix(strings.TrimSuffix(rest, ".up.sql"), ".down.sql")
		if up {
			m.Up = b.String()
		} else {
			m.Down = b.String()
		}
	}
	out := make([]driver.Migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.Up == "" || m.Down == "" {
			return nil, fmt.Errorf("idem: migration %04d_%s needs both an .up.sql and a .down.sql file", m.Version, m.Name)
		}
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}
