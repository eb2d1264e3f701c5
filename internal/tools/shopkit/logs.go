package shopkit

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/idem-go/idem/shop/store"
)

// RaceReport is the line the Go race detector writes when it finds a data
// race in a binary built with -race.
const RaceReport = "WARNING: DATA RACE"

// LogFindings is what the processes' logs say that a run must not ignore.
type LogFindings struct {
	// Races names the logs with a race report, with their count.
	Races []string
	// NotVisible counts the warnings store.NotVisibleMessage: a consumer
	// met an event whose row its producer's database did not show yet.
	NotVisible int
	// NotVisibleFirst is the first such line.
	NotVisibleFirst string
}

// ScanLogs reads every log of dir (Cluster.LogDir) for race reports and
// the shop's warnings that an event arrived before its row was visible.
func ScanLogs(dir string) (LogFindings, error) {
	var f LogFindings
	paths, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil {
		return f, err
	}
	sort.Strings(paths)
	for _, path := range paths {
		races, err := scanLog(path, &f)
		if err != nil {
			return f, err
		}
		if races > 0 {
			f.Races = append(f.Races, fmt.Sprintf("%s: %d", filepath.Base(path), races))
		}
	}
	return f, nil
}

func scanLog(path string, f *LogFindings) (races int, err error) {
	file, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, RaceReport):
			races++
		case strings.Contains(line, store.NotVisibleMessage):
			f.NotVisible++
			if f.NotVisibleFirst == "" {
				f.NotVisibleFirst = line
			}
		}
	}
	return races, sc.Err()
}

// Checks returns the rows of the verdict the findings give: no race
// report, and no event met before its row was visible (G13).
func (f LogFindings) Checks() (race, visible Check) {
	race = Check{What: "no data race reported by any process (binaries built with -race)", OK: len(f.Races) == 0, Observed: "0 race reports"}
	if !race.OK {
		race.Observed = "race reports in " + strings.Join(f.Races, ", ")
	}
	vis := Check{What: "G13: no consumer met an event before its row was visible in the producer's database", OK: f.NotVisible == 0, Observed: "0 events met before their row"}
	if !vis.OK {
		vis.Observed = fmt.Sprintf("%d times a consumer did not find the row its event announces (first: %s)", f.NotVisible, f.NotVisibleFirst)
	}
	return race, vis
}
