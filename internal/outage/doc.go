// Package outage holds the tests of guarantee G8: a dependency that is away
// for a while (the consumer's database, the broker, a downstream HTTP
// service) costs time only. Each test stops or breaks a real server for 30
// seconds while events flow, then checks that nothing was parked, that every
// effect was applied once and in order per aggregate, and that consumption
// resumed within seconds of the dependency's return. The tests take the
// servers they stop exclusively (internal/testdb, internal/testamqp), so
// that other tests of the run wait instead of failing.
package outage
