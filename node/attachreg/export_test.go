package attachreg

import (
	"context"
	"fmt"
)

// UnregisterWithFault is UnregisterInterface with fault called before each
// map's delete: a non-nil error stands for that map's, and the delete is
// not made. The fault wraps the maps only for this call, so the product
// carries no fault switch.
func (r *Registry) UnregisterWithFault(ctx context.Context, ifindex uint32, fault func(mapName string) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("unregister interface %d: %w", ifindex, err)
	}
	maps := r.perInterfaceMaps()
	for i, m := range maps {
		del := m.delete
		maps[i].delete = func(ifindex uint32) error {
			if err := fault(m.name); err != nil {
				return err
			}
			return del(ifindex)
		}
	}
	return r.unregister(ifindex, maps)
}

// UnregisterKilledAfter runs only the first n steps of UnregisterInterface,
// as a teardown SIGKILLed after its n-th step leaves things, and returns
// how many steps a whole unregister has. A kill cannot be placed between
// two syscalls of a real process on demand.
func (r *Registry) UnregisterKilledAfter(ifindex uint32, n int) int {
	steps := r.unregisterSteps(ifindex, r.perInterfaceMaps())
	for _, s := range steps[:min(n, len(steps))] {
		_ = s.do()
	}
	return len(steps)
}
