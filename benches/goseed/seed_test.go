package main

import (
	"os"
	"testing"
)

// BenchmarkSeedPlan: GOSEED_CASE=<case file> go test -bench SeedPlan -benchtime 3x
func BenchmarkSeedPlan(b *testing.B) {
	path := os.Getenv("GOSEED_CASE")
	if path == "" {
		b.Skip("GOSEED_CASE (a case file written by benches/bench_planner.py) is not set")
	}
	pools, err := ReadCase(path)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := Run(pools); err != nil {
			b.Fatal(err)
		}
	}
}
