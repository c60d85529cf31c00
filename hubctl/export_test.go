package hubctl

// BreakDirectRead, BreakRetainCheck and BreakRelease switch off a check or
// the release itself: the deliberately broken variants the chaos suite must
// catch.
func (c *Controller) BreakDirectRead()  { c.broken.directRead = true }
func (c *Controller) BreakRetainCheck() { c.broken.retainCheck = true }
func (c *Controller) BreakRelease()     { c.broken.release = true }
