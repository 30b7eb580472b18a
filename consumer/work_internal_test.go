package consumer

import (
	"sync"
	"testing"
)

// closed reports whether ch is closed, without waiting.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestTask_doneChan(t *testing.T) {
	t.Parallel()
	t.Run("waited for, then ended", func(t *testing.T) {
		t.Parallel()
		var tk task
		ch := tk.doneChan()
		if closed(ch) || closed(tk.doneChan()) {
			t.Fatal("done before end")
		}
		tk.end()
		if !closed(ch) || !closed(tk.doneChan()) {
			t.Fatal("not done after end")
		}
	})
	t.Run("ended, then waited for", func(t *testing.T) {
		t.Parallel()
		var tk task
		tk.end()
		if !closed(tk.doneChan()) {
			t.Fatal("not done after end")
		}
	})
	t.Run("concurrent", func(t *testing.T) {
		t.Parallel()
		for range 200 {
			var tk task
			var wg sync.WaitGroup
			chans := make([]<-chan struct{}, 4)
			for i := range chans {
				wg.Go(func() { chans[i] = tk.doneChan() })
			}
			wg.Go(tk.end)
			wg.Wait()
			for _, ch := range chans {
				<-ch // every waiter's channel is closed: no hang
			}
		}
	})
}
