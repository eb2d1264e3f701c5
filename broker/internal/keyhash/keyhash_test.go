package keyhash

import "testing"

// TestMod pins the mapping: changing it moves aggregates between
// partitions and buckets of running systems.
func TestMod(t *testing.T) {
	for _, c := range []struct {
		key  string
		n    int
		want int
	}{
		{"", 64, int(2166136261 % 64)}, // the FNV-1a 32 offset basis
		{"a", 64, int(0xe40c292c % 64)},
		{"foobar", 1 << 30, int(0xbf9cf968 % (1 << 30))},
		{"a", 0, 0},
	} {
		if got := Mod([]byte(c.key), c.n); got != c.want {
			t.Errorf("Mod(%q, %d) = %d, want %d", c.key, c.n, got, c.want)
		}
	}
}
