package dashboard

import (
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestFitSpan: the window is the shortest that holds the samples, within
// the history kept.
func TestFitSpan(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(ds ...time.Duration) []time.Time {
		out := make([]time.Time, len(ds))
		for i, d := range ds {
			out[i] = t0.Add(d)
		}
		return out
	}
	for _, c := range []struct {
		times          []time.Time
		every, history time.Duration
		want           time.Duration
	}{
		{nil, 10 * time.Second, time.Hour, time.Minute},
		{at(0), 10 * time.Second, time.Hour, time.Minute},
		{at(0, 4*time.Minute+50*time.Second), 10 * time.Second, time.Hour, 5 * time.Minute},
		{at(0, 5*time.Minute+10*time.Second), 10 * time.Second, time.Hour, 10 * time.Minute},
		{at(0, 50*time.Minute), 10 * time.Second, time.Hour, time.Hour},
		{at(0, 50*time.Minute), 10 * time.Second, 45 * time.Minute, 45 * time.Minute},
		{at(0, 3*time.Second), time.Minute, time.Hour, 2 * time.Minute},
		{at(0, 30*time.Hour), time.Minute, 48 * time.Hour, 48 * time.Hour},
	} {
		if got := fitSpan(c.times, c.every, c.history); got != c.want {
			t.Errorf("fitSpan(%d samples over %v, every %v, history %v) = %v, want %v",
				len(c.times), spanOf(c.times), c.every, c.history, got, c.want)
		}
	}
}

func spanOf(ts []time.Time) time.Duration {
	if len(ts) < 2 {
		return 0
	}
	return ts[len(ts)-1].Sub(ts[0])
}

// TestChartLabelsOutsidePlot: the scale and the time axis lie in their
// bands, and every point of a line in the plot area between them, so no
// label covers the line, whatever its values.
func TestChartLabelsOutsidePlot(t *testing.T) {
	now := time.Now()
	var times []time.Time
	var values []float64
	for i := range 30 {
		times = append(times, now.Add(time.Duration(i-29)*10*time.Second))
		values = append(values, float64(i*i))
	}
	values[3] = math.NaN()
	svg := string(chart{title: "t", times: times, span: fitSpan(times, 10*time.Second, time.Hour),
		series: []series{{"v", "s0", values}}}.svg())
	if !strings.Contains(svg, ">-5m</text>") || !strings.Contains(svg, ">now</text>") || !strings.Contains(svg, ">1000</text>") {
		t.Errorf("want the labels -5m, now and the scale 1000:\n%s", svg)
	}
	for _, m := range regexp.MustCompile(`<text class="axis[^"]*" x="\d+" y="(\d+)"`).FindAllStringSubmatch(svg, -1) {
		y, _ := strconv.Atoi(m[1])
		if y > chartTop && y < chartH-chartBottom+chartPad {
			t.Errorf("a label at y=%d, inside the plot area (%d-%d)", y, chartTop, chartH-chartBottom)
		}
	}
	pts := regexp.MustCompile(`points="([^"]*)"`).FindAllStringSubmatch(svg, -1)
	if len(pts) == 0 {
		t.Fatalf("no line:\n%s", svg)
	}
	for _, p := range pts {
		for _, xy := range strings.Fields(p[1]) {
			xs, ys, _ := strings.Cut(xy, ",")
			x, _ := strconv.ParseFloat(xs, 64)
			y, _ := strconv.ParseFloat(ys, 64)
			if y < chartTop || y > chartH-chartBottom || x < 0 || x > chartW {
				t.Errorf("point %s outside the plot area", xy)
			}
		}
	}
}
