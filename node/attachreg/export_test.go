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
