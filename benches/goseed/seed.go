// Command goseed times the seed kubelet's ResourceSlice sync (1.30, pkg/kubelet/cm/dra/plugin/
// noderesources.go) on the bytes benches/bench_planner.py gives the Rust planner: per pool,
// every desired spec and observed slice decoded from JSON into the v1 API types, then for each
// observed slice a scan of the desired specs with apiequality.Semantic.DeepEqual (O(n*m)).
//
// Usage: goseed CASEFILE [ROUNDS]. CASEFILE (written by the bench): uint32 pool count, then per
// pool uint32 desired count, uint32 observed count and each item as uint32 length + bytes; all
// little-endian. Prints one line: "goseed ns/op=N decode-ns/op=N slices=N obsolete=N create=N"
// (the whole sync, then its decoding alone).
package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
)

// Pool is one driver's input: desired specs and observed ResourceSlice objects, as JSON.
type Pool struct {
	Desired  [][]byte
	Observed [][]byte
}

// Plan is the seed's outcome for one pool: slices to delete or reuse, models to write.
type Plan struct {
	Obsolete int
	Create   int
}

// SeedPlan is the seed's sync for one driver. The desired models and the observed slices are
// decoded each time: the seed held decoded objects, but this is the cold case the Rust planner
// is measured on (every slice from its bytes). spec.pool is compared by the modern controller
// separately, so it is left out of the content comparison here as it is in the bench's Python
// seed.
func SeedPlan(p Pool) (Plan, error) {
	desired, observed, err := Decode(p)
	if err != nil {
		return Plan{}, err
	}
	return Match(desired, observed), nil
}

// Decode decodes one pool's desired specs and observed slices, each without its pool.
func Decode(p Pool) ([]resourcev1.ResourceSliceSpec, []resourcev1.ResourceSlice, error) {
	desired := make([]resourcev1.ResourceSliceSpec, len(p.Desired))
	for i, b := range p.Desired {
		if err := json.Unmarshal(b, &desired[i]); err != nil {
			return nil, nil, fmt.Errorf("desired %d: %w", i, err)
		}
		desired[i].Pool = resourcev1.ResourcePool{}
	}
	observed := make([]resourcev1.ResourceSlice, len(p.Observed))
	for i, b := range p.Observed {
		if err := json.Unmarshal(b, &observed[i]); err != nil {
			return nil, nil, fmt.Errorf("observed %d: %w", i, err)
		}
		observed[i].Spec.Pool = resourcev1.ResourcePool{}
	}
	return desired, observed, nil
}

// Match is the seed's matching: each observed slice marks the first semantically equal desired
// model not yet stored; a slice matching none is obsolete.
func Match(desired []resourcev1.ResourceSliceSpec, observed []resourcev1.ResourceSlice) Plan {
	stored := make([]bool, len(desired))
	var plan Plan
	for j := range observed {
		found := false
		for i := range desired {
			if !stored[i] && apiequality.Semantic.DeepEqual(desired[i], observed[j].Spec) {
				stored[i] = true
				found = true
				break
			}
		}
		if !found {
			plan.Obsolete++
		}
	}
	for _, s := range stored {
		if !s {
			plan.Create++
		}
	}
	return plan
}

// ReadCase reads a case file written by bench_planner.py.
func ReadCase(path string) ([]Pool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pos := 0
	u32 := func() (int, error) {
		if pos+4 > len(data) {
			return 0, fmt.Errorf("%s: truncated at byte %d", path, pos)
		}
		v := int(binary.LittleEndian.Uint32(data[pos:]))
		pos += 4
		return v, nil
	}
	items := func(n int) ([][]byte, error) {
		out := make([][]byte, n)
		for i := range out {
			l, err := u32()
			if err != nil {
				return nil, err
			}
			if pos+l > len(data) {
				return nil, fmt.Errorf("%s: truncated item at byte %d", path, pos)
			}
			out[i] = data[pos : pos+l]
			pos += l
		}
		return out, nil
	}
	npools, err := u32()
	if err != nil {
		return nil, err
	}
	pools := make([]Pool, npools)
	for k := range pools {
		nd, err := u32()
		if err != nil {
			return nil, err
		}
		no, err := u32()
		if err != nil {
			return nil, err
		}
		if pools[k].Desired, err = items(nd); err != nil {
			return nil, err
		}
		if pools[k].Observed, err = items(no); err != nil {
			return nil, err
		}
	}
	return pools, nil
}

// Run plans every pool once.
func Run(pools []Pool) (Plan, error) {
	var total Plan
	for _, p := range pools {
		plan, err := SeedPlan(p)
		if err != nil {
			return Plan{}, err
		}
		total.Obsolete += plan.Obsolete
		total.Create += plan.Create
	}
	return total, nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: goseed CASEFILE [ROUNDS]")
		os.Exit(2)
	}
	pools, err := ReadCase(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	rounds := 3
	if len(os.Args) > 2 {
		if rounds, err = strconv.Atoi(os.Args[2]); err != nil || rounds < 1 {
			fmt.Fprintln(os.Stderr, "ROUNDS must be a positive integer")
			os.Exit(2)
		}
	}
	plan, err := Run(pools)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The best of ROUNDS benchmark runs, like the Python side's benchmark.pedantic min: the
	// machine is shared. The decoding alone is timed too, to show where the time goes.
	bestOf := func(f func() error) int64 {
		best := int64(-1)
		for r := 0; r < rounds; r++ {
			res := testing.Benchmark(func(b *testing.B) {
				for b.Loop() {
					if err := f(); err != nil {
						b.Fatal(err)
					}
				}
			})
			if ns := res.NsPerOp(); best < 0 || ns < best {
				best = ns
			}
		}
		return best
	}
	best := bestOf(func() error { _, err := Run(pools); return err })
	decode := bestOf(func() error {
		for _, p := range pools {
			if _, _, err := Decode(p); err != nil {
				return err
			}
		}
		return nil
	})
	slices := 0
	for _, p := range pools {
		slices += len(p.Observed)
	}
	fmt.Printf("goseed ns/op=%d decode-ns/op=%d slices=%d obsolete=%d create=%d\n",
		best, decode, slices, plan.Obsolete, plan.Create)
}
