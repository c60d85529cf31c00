package reclaim

// BreakHeldCheck, BreakCarriedCheck and BreakRemoval are the deliberately
// broken variants the chaos suite must catch: every holder check off, every
// inventory check off, and no removal at all.
func (r *Reclaimer) BreakHeldCheck()    { r.ignoreHeld = true }
func (r *Reclaimer) BreakCarriedCheck() { r.ignoreCarried = true }
func (r *Reclaimer) BreakRemoval()      { r.cfg.DryRun = true }
