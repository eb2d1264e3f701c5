package dashboard

import (
	"fmt"
	"html"
	"html/template"
	"math"
	"strings"
	"time"
)

// series is one line of a chart: a value per sample, NaN where unknown.
type series struct {
	label  string
	color  string // a CSS class: s0, s1...
	values []float64
}

// chart is a small line chart of the last hour, rendered as inline SVG.
type chart struct {
	title  string
	unit   string // "s" formats values as durations
	times  []time.Time
	series []series
	span   time.Duration
}

// The chart's frame: the plot area leaves a band above it for the scale
// and one below for the time axis, so that no label covers a line.
const (
	chartW, chartH = 320, 110
	chartPad       = 4
	chartTop       = 15 // the scale's band
	chartBottom    = 15 // the time axis's band
)

// spans are the windows a chart may show, the shortest that holds the
// samples: five minutes of traffic fill the chart as an hour does.
var spans = []time.Duration{
	time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
}

// fitSpan returns the window of charts over samples taken at times: the
// shortest of spans that holds them all, at most history (the samples
// kept), and at least two sampling intervals.
func fitSpan(times []time.Time, every, history time.Duration) time.Duration {
	age := 2 * every
	if n := len(times); n > 1 {
		age = max(age, times[n-1].Sub(times[0]))
	}
	for _, s := range spans {
		if s >= age {
			return min(s, history)
		}
	}
	return history
}

// svg renders the chart. Every text in it is escaped.
func (c chart) svg() template.HTML {
	var b strings.Builder
	max := 0.0
	for _, s := range c.series {
		for _, v := range s.values {
			if !math.IsNaN(v) && v > max {
				max = v
			}
		}
	}
	top := niceCeil(max)
	end := time.Now()
	if n := len(c.times); n > 0 {
		end = c.times[n-1]
	}
	start := end.Add(-c.span)
	x := func(t time.Time) float64 {
		return chartPad + float64(chartW-2*chartPad)*float64(t.Sub(start))/float64(c.span)
	}
	plotTop, plotBottom := float64(chartTop+chartPad), float64(chartH-chartBottom-chartPad)
	y := func(v float64) float64 {
		if top == 0 {
			return plotBottom
		}
		return plotBottom - (plotBottom-plotTop)*v/top
	}
	fmt.Fprintf(&b, `<figure class="chart"><figcaption>%s</figcaption>`, html.EscapeString(c.title))
	fmt.Fprintf(&b, `<svg viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="%s">`, chartW, chartH, chartW, chartH, html.EscapeString(c.title))
	fmt.Fprintf(&b, `<rect class="frame" x="0.5" y="%d.5" width="%d" height="%d"/>`, chartTop, chartW-1, chartH-chartTop-chartBottom-1)
	// The scale: a dotted line at the top value, its label above the frame.
	fmt.Fprintf(&b, `<line class="grid" x1="1" x2="%d" y1="%.1f" y2="%.1f"/>`, chartW-1, plotTop, plotTop)
	fmt.Fprintf(&b, `<text class="axis" x="%d" y="%d">%s</text>`, chartPad, chartTop-4, html.EscapeString(c.format(top)))
	// The time axis, below the frame: the window's start and now.
	fmt.Fprintf(&b, `<text class="axis" x="%d" y="%d">-%s</text>`, chartPad, chartH-4, html.EscapeString(roundSpan(c.span)))
	fmt.Fprintf(&b, `<text class="axis end" x="%d" y="%d">now</text>`, chartW-chartPad, chartH-4)
	if len(c.times) == 0 {
		fmt.Fprintf(&b, `<text class="empty" x="%d" y="%d">no samples yet</text>`, chartW/2, chartH/2)
	}
	for _, s := range c.series {
		var pts [][2]float64
		flush := func() {
			switch len(pts) {
			case 0:
			case 1:
				// A lone point: a dot, so that it shows.
				fmt.Fprintf(&b, `<circle class="%s" cx="%.1f" cy="%.1f" r="1.5"/>`, s.color, pts[0][0], pts[0][1])
			default:
				fmt.Fprintf(&b, `<polyline class="%s" points="`, s.color)
				for i, p := range pts {
					if i > 0 {
						b.WriteByte(' ')
					}
					fmt.Fprintf(&b, "%.1f,%.1f", p[0], p[1])
				}
				b.WriteString(`"/>`)
			}
			pts = pts[:0]
		}
		for i, v := range s.values {
			if i >= len(c.times) || math.IsNaN(v) {
				flush()
				continue
			}
			pts = append(pts, [2]float64{x(c.times[i]), y(v)})
		}
		flush()
	}
	b.WriteString(`</svg><div class="legend">`)
	for _, s := range c.series {
		last := "–"
		for i := len(s.values) - 1; i >= 0; i-- {
			if !math.IsNaN(s.values[i]) {
				last = c.format(s.values[i])
				break
			}
		}
		fmt.Fprintf(&b, `<span><i class="%s"></i>%s <b>%s</b></span>`, s.color, html.EscapeString(s.label), html.EscapeString(last))
	}
	b.WriteString(`</div></figure>`)
	return template.HTML(b.String())
}

func (c chart) format(v float64) string {
	if c.unit == "s" {
		return formatSeconds(v)
	}
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

// formatSeconds formats a delay in seconds for people: 850µs, 12ms, 1.5s.
func formatSeconds(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	d := time.Duration(v * float64(time.Second))
	switch {
	case d < time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Second:
		return d.Round(100 * time.Microsecond).String()
	case d < time.Minute:
		return d.Round(10 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func roundSpan(d time.Duration) string {
	if d < time.Minute {
		return d.Round(time.Second).String()
	}
	s := d.Round(time.Minute).String()
	s = strings.TrimSuffix(s, "0s")
	return strings.TrimSuffix(s, "0m")
}

// niceCeil returns a round number at least v (1, 2, 5 times a power of
// ten); 0 for 0.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 0
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// sparkline is a tiny chart of one series, without axes, for a table cell.
func sparkline(times []time.Time, values []float64, span time.Duration) template.HTML {
	const w, h = 120, 22
	max := 0.0
	for _, v := range values {
		if !math.IsNaN(v) && v > max {
			max = v
		}
	}
	if len(times) == 0 {
		return ""
	}
	end := times[len(times)-1]
	start := end.Add(-span)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="spark" viewBox="0 0 %d %d" width="%d" height="%d" aria-hidden="true"><polyline class="s1" points="`, w, h, w, h)
	first := true
	for i, v := range values {
		if math.IsNaN(v) {
			continue
		}
		y := float64(h - 2)
		if max > 0 {
			y = float64(h-2) - float64(h-4)*v/max
		}
		x := float64(w) * float64(times[i].Sub(start)) / float64(span)
		if !first {
			b.WriteByte(' ')
		}
		first = false
		fmt.Fprintf(&b, "%.1f,%.1f", x, y)
	}
	b.WriteString(`"/></svg>`)
	return template.HTML(b.String())
}
