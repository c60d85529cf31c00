package hubctl

// BreakDirectRead and BreakRetainCheck switch off a safety check: the
// deliberately broken variants the chaos suite must catch.
func (c *Controller) BreakDirectRead()  { c.broken.directRead = true }
func (c *Controller) BreakRetainCheck() { c.broken.retainCheck = true }
