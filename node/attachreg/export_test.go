package attachreg

// SetDeleteFault installs the test-only fault seam of UnregisterInterface.
func (r *Registry) SetDeleteFault(f func(mapName string) error) { r.deleteFault = f }
