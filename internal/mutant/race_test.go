//go:build race

package mutant_test

const raceEnabled = true
