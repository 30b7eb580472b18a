package metrics

import "time"

// SetClock replaces the clock the collector's cache uses.
func (c *Collector) SetClock(now func() time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = now
}
