// Package keyhash is the hash the broker packages use to map a message key
// (an aggregate id) to a partition or bucket, so that every transport places
// one aggregate the same way: FNV-1a 32.
package keyhash

import "hash/fnv"

// Sum returns FNV-1a 32 of key.
func Sum(key []byte) uint32 {
	h := fnv.New32a()
	_, _ = h.Write(key)
	return h.Sum32()
}

// Mod returns FNV-1a 32 of key modulo n, in [0, n); 0 when n <= 0.
func Mod(key []byte, n int) int {
	if n <= 0 {
		return 0
	}
	return int(Sum(key) % uint32(n))
}
