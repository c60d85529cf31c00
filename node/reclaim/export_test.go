package reclaim

// BreakHeldCheck switches every holder check off: the deliberately broken
// variant the chaos suite must catch.
func (r *Reclaimer) BreakHeldCheck() { r.ignoreHeld = true }
