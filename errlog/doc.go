// Package errlog logs the failures of an operation that fails again and
// again while something it needs is away, such as each request of a service
// whose database is down or each claim of a relay, without one line per
// failure.
//
// A Limiter logs the failures of one operation, by cause: the message with
// the error's text, its digits masked (the "connection refused" of each
// dial to 10.0.0.7:5432 is one cause; a different error is another):
//
//   - the first failure of a cause is logged at once, as it is;
//   - its repeats are counted, and logged at most once per Config.Interval
//     (10s): the same line, with the latest error and attributes, repeated
//     (how many times since the cause's last line, or since the last
//     recovered line) and over (the time since the cause's last line);
//   - the first success that follows (Limiter.OK) logs one line,
//     "<what> recovered", with failed_for (since the first failure after the
//     previous success) and failures (how many since the previous recovered
//     line).
//
// An operation that fails intermittently, one request in ten for instance,
// does not log a line per failure either: a cause logged less than an
// interval ago is counted, whatever succeeded meanwhile, and a success
// after failures that were only counted logs nothing (they are in the
// counts of the next lines). So each cause costs at most one line per
// interval, and a recovered line follows a logged line.
//
// A Limiter remembers Config.MaxCauses causes (32); beyond them, until
// causes age out, failures of other causes are counted together (a line
// with other_causes_repeated), so that a stream of distinct errors cannot
// grow its memory. Limiter.OK is an atomic
// load while nothing fails: call it on every success of hot paths.
package errlog
