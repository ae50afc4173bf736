package wharfconsole_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/wharfhq/wharf"
	"github.com/wharfhq/wharf/internal/testtool"
	"github.com/wharfhq/wharf/wharfconsole"
	"github.com/wharfhq/wharf/wharfflow"
)

// xssKey is a key that would run script if the console put it in the page as
// markup.
const xssKey = `<img src=x onerror=alert(1)>`

// sinkRecorder is the relay's handler: it records what it delivered, fails
// the "stuck" key for ever (retrying) and the ids in failing permanently
// (dead-lettered).
type sinkRecorder struct {
	mu        sync.Mutex
	delivered map[string]bool
	failing   map[string]bool
}

func (s *sinkRecorder) handle(_ context.Context, m *wharf.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m.Key == "stuck" {
		return errors.New(`connection refused <script>alert("err")</script>`)
	}
	if s.failing[m.ID] || m.Topic == "payments" && s.failing["*"] {
		return wharf.Permanent(errors.New("payload rejected: <b>bad amount</b>"))
	}
	s.delivered[m.ID] = true
	return nil
}

func (s *sinkRecorder) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.delivered[id]
}

// pageErrors collects what the page must never produce: exceptions, console
// errors, browser-log errors (a CSP violation, a failed request) and dialogs
// (an injected alert).
type pageErrors struct {
	mu   sync.Mutex
	errs []string
}

func (p *pageErrors) listen(ev any) {
	var msg string
	switch e := ev.(type) {
	case *runtime.EventExceptionThrown:
		msg = "exception: " + e.ExceptionDetails.Text
		if e.ExceptionDetails.Exception != nil {
			msg += " " + e.ExceptionDetails.Exception.Description
		}
	case *runtime.EventConsoleAPICalled:
		if e.Type == runtime.ConsoleAPICalledTypeError || e.Type == runtime.ConsoleAPICalledTypeAssert || e.Type == runtime.ConsoleAPICalledTypeWarning {
			var parts []string
			for _, a := range e.Args {
				parts = append(parts, string(a.Value)+a.Description)
			}
			msg = "console." + string(e.Type) + ": " + strings.Join(parts, " ")
		}
	case *log.EventEntryAdded:
		if e.Entry.Level == log.EntryLevelError || e.Entry.Level == log.EntryLevelWarning {
			msg = "log " + string(e.Entry.Level) + ": " + e.Entry.Text + " " + e.Entry.URL
		}
	case *page.EventJavascriptDialogOpening:
		msg = "dialog opened: " + e.Message
	}
	if msg != "" {
		p.mu.Lock()
		p.errs = append(p.errs, msg)
		p.mu.Unlock()
	}
}

func (p *pageErrors) take() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.errs
	p.errs = nil
	return out
}

func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("WHARF_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	testtool.Missing(t, "chromium", "no browser found for the console's browser test (apt-get install -y chromium, or set WHARF_CHROMIUM to the browser binary)")
	return ""
}

// artifactsDir is $WHARF_ARTIFACTS when set (to keep the screenshots), or
// a directory removed after the test: a test run never writes into the
// repository.
func artifactsDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("WHARF_ARTIFACTS")
	if dir == "" {
		return t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return dir
}

// updateScreenshotsEnv, set to 1, makes TestConsoleInBrowser copy its
// screenshots over the README's docs/img/console-*.png (make screenshots).
// Without it the test writes nothing into the repository.
const updateScreenshotsEnv = "WHARF_UPDATE_SCREENSHOTS"

// The console in a real browser against a real relay and flow runner: auth,
// every page without a script error, a dead letter retried by clicking and
// delivered, a scheduled message cancelled by clicking and never delivered,
// a failed flow instance found from its count and retried by clicking until
// the runner finishes it, untrusted values shown as text, read-only mode,
// and screenshots.
func TestConsoleInBrowser(t *testing.T) {
	chromium := chromiumPath(t)
	ctx := context.Background()
	pool, schema := newSchema(t)
	rec := &sinkRecorder{delivered: map[string]bool{}, failing: map[string]bool{"*": true}}
	relayID := "console-test-relay"
	c, err := wharf.NewClient(pool, &wharf.Config{
		Schema: schema, Logger: testLogger(), RelayID: relayID, Handler: rec.handle,
		LeaseTTL: 3 * time.Second, RebalanceInterval: 200 * time.Millisecond, PollInterval: 50 * time.Millisecond,
		MaxAttempts: 1000, RetryBackoff: 10 * time.Minute, MaxRetryBackoff: 10 * time.Minute,
	})
	require.NoError(t, err)

	// What the pages show: traffic, a dead letter to retry and one to purge,
	// a key held behind a scheduled message (with a key that is markup), a
	// key held behind a retrying one, and two messages due shortly: one to
	// cancel, one to show the relay would have delivered it.
	var due []wharf.Message
	for i := 0; i < 200; i++ {
		due = append(due, wharf.Message{Topic: "orders.created", Key: fmt.Sprintf("order-%d", i%40), Payload: fmt.Appendf(nil, `{"order":%d,"total":"%d.99"}`, i, i)})
	}
	_, err = c.Enqueue(ctx, due...)
	require.NoError(t, err)
	deadRetry := enqueueOne(t, c, wharf.Message{Topic: "payments", Key: "pay-1", Payload: []byte(`{"amount":-5}`), Headers: map[string]string{"source": "<script>x</script>"}})
	deadPurge := enqueueOne(t, c, wharf.Message{Topic: "payments", Key: "pay-2", Payload: []byte{0xde, 0xad, 0xbe, 0xef}})
	later := time.Now().Add(time.Hour)
	enqueueOne(t, c, wharf.Message{Topic: "orders", Key: xssKey, Payload: []byte(`{"note":"<img src=y onerror=alert(2)>"}`), DeliverAt: later})
	enqueueOne(t, c, wharf.Message{Topic: "orders", Key: xssKey, Payload: []byte(`{"n":2}`)})
	enqueueOne(t, c, wharf.Message{Topic: "orders", Key: xssKey, Payload: []byte(`{"n":3}`)})
	stuck := enqueueOne(t, c, wharf.Message{Topic: "emails", Key: "stuck", Payload: []byte("hello")})
	for i := 0; i < 3; i++ {
		enqueueOne(t, c, wharf.Message{Topic: "emails", Key: "stuck", Payload: []byte("behind")})
	}

	require.NoError(t, c.Start(ctx))
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, c.Stop(sctx))
	}()
	require.Eventually(t, func() bool {
		ds, err := c.DeadLetters(ctx, wharf.DeadLetterFilter{})
		if err != nil || len(ds) < 2 {
			return false
		}
		b, err := c.BlockedKeys(ctx, 0)
		return err == nil && len(b.Keys) == 2 && b.Keys[1].Reason == wharf.BlockedRetrying
	}, 60*time.Second, 100*time.Millisecond, "the relay dead-letters the payments and retries the stuck key")
	_ = stuck
	// From now on the payments go through.
	rec.mu.Lock()
	delete(rec.failing, "*")
	rec.mu.Unlock()

	// Flows on the same schema: a payout that failed (its note is markup)
	// and a checkout awaiting its payment.
	fx := newFlowFixture(t, pool, schema)
	failedFlow := fx.start(fx.payout.Start(payoutState{Cents: 1250, Note: badNote}, wharfflow.StartOptions{Key: "payout-7"}))
	awaitingFlow := fx.start(fx.order.Start(orderState{ID: "o-7", Items: []string{"book"}}, wharfflow.StartOptions{Key: "o-7"}))
	toSignal := fx.start(fx.order.Start(orderState{ID: "o-8", Items: []string{"lamp"}}, wharfflow.StartOptions{Key: "o-8"}))
	toCancelFlow := fx.start(fx.order.Start(orderState{ID: "o-9"}, wharfflow.StartOptions{Key: "o-9"}))
	fx.waitStatus(failedFlow, "failed")
	for _, id := range []int64{awaitingFlow, toSignal, toCancelFlow} {
		fx.waitStatus(id, "awaiting")
	}

	const token = "console-test-token"
	mux := http.NewServeMux()
	mux.Handle("/console/", http.StripPrefix("/console", wharfconsole.Handler(c, wharfconsole.WithToken(token), wharfconsole.WithLogger(testLogger()), wharfconsole.WithFlows(fx.client))))
	mux.Handle("/ro/", http.StripPrefix("/ro", wharfconsole.Handler(c, wharfconsole.WithToken(token), wharfconsole.WithReadOnly(true), wharfconsole.WithLogger(testLogger()), wharfconsole.WithFlows(fx.client))))
	// A console without flows, and without a token (loopback only).
	mux.Handle("/noflows/", http.StripPrefix("/noflows", wharfconsole.Handler(c, wharfconsole.WithLogger(testLogger()))))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	// Auth, as a program sees it.
	anon := newAPIClient(t, srv.URL, "")
	code, hdr, _ := anon.do("GET", "/console/", "")
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "./login", hdr.Get("Location"))
	code, _, _ = anon.do("GET", "/console/api/status", "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _, _ = newAPIClient(t, srv.URL, "wrong").do("GET", "/console/api/status", "")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _, _ = newAPIClient(t, srv.URL, token).do("GET", "/console/api/status", "")
	require.Equal(t, http.StatusOK, code)

	// The browser.
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1440, 1000), chromedp.DisableGPU)...)
	defer cancelAlloc()
	perrs := &pageErrors{}
	bctx, cancelBrowser := chromedp.NewContext(allocCtx, chromedp.WithListener(perrs.listen))
	defer cancelBrowser()
	require.NoError(t, chromedp.Do(bctx)) // start the browser with no deadline
	dir := artifactsDir(t)

	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(bctx, 90*time.Second)
		defer cancel()
		require.NoError(t, chromedp.Do(sctx, steps...), what)
	}
	waitJS := func(what, expr string) {
		t.Helper()
		// Evaluated again and again, not with Poll: a navigation in the
		// middle (a form post, a redirect) ends a Poll with an error.
		deadline := time.Now().Add(90 * time.Second)
		var last error
		for time.Now().Before(deadline) {
			sctx, cancel := context.WithTimeout(bctx, 10*time.Second)
			ok, err := chromedp.Run(sctx, chromedp.Evaluate[bool](`!!(`+expr+`)`))
			cancel()
			if err == nil && ok {
				return
			}
			last = err
			time.Sleep(100 * time.Millisecond)
		}
		sctx, cancel := context.WithTimeout(bctx, 10*time.Second)
		state, _ := chromedp.Run(sctx, chromedp.Evaluate[string](`location.href + " page=" + document.body.dataset.page + " loaded=" + document.body.dataset.loaded + "\n" + document.body.innerText.slice(0, 2000)`))
		cancel()
		t.Fatalf("waiting for %s: %s (last error: %v)\npage: %s\npage errors: %q", what, expr, last, state, perrs.take())
	}
	eval := func(expr string) string {
		t.Helper()
		sctx, cancel := context.WithTimeout(bctx, 60*time.Second)
		defer cancel()
		v, err := chromedp.Run(sctx, chromedp.Evaluate[string](expr))
		require.NoError(t, err, expr)
		return v
	}
	noErrors := func(where string) {
		t.Helper()
		require.Empty(t, perrs.take(), "page errors on %s", where)
	}
	shot := func(name string) {
		t.Helper()
		sctx, cancel := context.WithTimeout(bctx, 60*time.Second)
		defer cancel()
		png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644))
	}
	gotoPage := func(name, ready string) {
		t.Helper()
		run("open "+name, chromedp.Evaluate[chromedp.Void](`location.hash = "#/`+name+`"`))
		waitJS(name+" loaded", `document.body.dataset.page === "`+name+`" && document.body.dataset.loaded === "1"`)
		if ready != "" {
			waitJS(name+" content", ready)
		}
	}

	// Without the token the page sends the browser to the login form; a
	// wrong token is refused there.
	run("open the console", chromedp.Navigate(srv.URL+"/console/"))
	waitJS("the login page", `location.pathname === "/console/login" && !!document.querySelector("#token")`)
	shot("login")
	run("log in with a wrong token", setValue("#token", "not-the-token"), chromedp.Click(chromedp.CSS("#login-submit")))
	waitJS("the refusal", `!!document.querySelector("#login-error") && location.pathname === "/console/login"`)
	require.Contains(t, eval(`document.querySelector("#login-error").textContent`), "Wrong token")
	perrs.take() // the browser logs the 401 of the refused form
	run("log in", setValue("#token", token), chromedp.Click(chromedp.CSS("#login-submit")))
	waitJS("the overview", `location.pathname === "/console/" && document.body.dataset.page === "overview" && document.body.dataset.loaded === "1"`)

	// Overview: counters and live charts (a few polls, 2 s apart) while a
	// producer keeps the relay busy.
	stopProducing := make(chan struct{})
	produced := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stopProducing:
				produced <- nil
				return
			case <-time.After(100 * time.Millisecond):
			}
			batch := make([]wharf.Message, 5+i%15)
			for j := range batch {
				batch[j] = wharf.Message{Topic: "orders.paid", Key: fmt.Sprintf("order-%d", j), Payload: []byte(`{}`)}
			}
			if _, err := c.Enqueue(ctx, batch...); err != nil {
				produced <- err
				return
			}
		}
	}()
	waitJS("six polls", `hist.length >= 6 && document.querySelectorAll(".chart polyline").length >= 4`)
	close(stopProducing)
	require.NoError(t, <-produced)
	overview := eval(`document.querySelector("#main").textContent`)
	require.Contains(t, overview, "Dead letters")
	require.Contains(t, overview, "delivered/s (relay in this process)")
	noErrors("overview")
	shot("overview")

	gotoPage("relays", `!!document.querySelector('#relays tr[data-relay="`+relayID+`"]')`)
	require.Contains(t, eval(`document.querySelector("#relays").textContent`), "live")
	noErrors("relays")
	shot("relays")

	gotoPage("lanes", `document.querySelectorAll("#lanes .lane").length === 64`)
	require.Equal(t, "0", eval(`String(document.querySelectorAll("#lanes .lane.uncovered").length)`))
	noErrors("lanes")
	shot("lanes")

	// Blocked keys: the markup key is text, and nothing ran.
	gotoPage("blocked", `document.querySelectorAll("#blocked tr[data-key]").length === 2`)
	blockedText := eval(`document.querySelector("#blocked").textContent`)
	require.Contains(t, blockedText, xssKey)
	require.Contains(t, blockedText, "retrying")
	require.Contains(t, blockedText, `connection refused <script>alert("err")</script>`)
	require.Equal(t, "0", eval(`String(document.querySelectorAll("#main img, #main script, #main b").length)`))
	noErrors("blocked keys")
	shot("blocked")

	// Pending: find the markup key's messages and show one.
	gotoPage("pending", `document.querySelectorAll("#pending tr[data-id]").length > 0`)
	run("search by key", setValue("#filter-key", xssKey), chromedp.Click(chromedp.CSS("#search")))
	waitJS("the key's messages", `document.querySelectorAll("#pending tr[data-id]").length === 3`)
	run("show the first", chromedp.Click(chromedp.CSS("#pending tr[data-id]")))
	waitJS("the detail", `!document.querySelector("#detail").hidden && document.querySelector("#detail-key").textContent === `+jsString(xssKey))
	require.Contains(t, eval(`document.querySelector("#payload").textContent`), `"note": "<img src=y onerror=alert(2)>"`)
	require.Equal(t, "0", eval(`String(document.querySelectorAll("#main img").length)`))
	noErrors("pending")
	shot("pending")

	// Cancel the scheduled reminder by clicking, with the confirmation.
	// Cancel a scheduled reminder by clicking, with the confirmation. Two
	// reminders due in 30 s: one to cancel, one to show the relay would
	// have delivered it.
	soon := time.Now().Add(30 * time.Second)
	toCancel := enqueueOne(t, c, wharf.Message{Topic: "reminders", Key: "r-1", Payload: []byte(`{"remind":"cancel me"}`), DeliverAt: soon})
	control := enqueueOne(t, c, wharf.Message{Topic: "reminders", Key: "r-2", Payload: []byte(`{"remind":"deliver me"}`), DeliverAt: soon})
	run("search the reminder", setValue("#filter-key", ""), setValue("#filter-id", toCancel), chromedp.Click(chromedp.CSS("#search")))
	waitJS("the reminder", `document.querySelectorAll("#pending tr[data-id]").length === 1`)
	run("select it", chromedp.Click(chromedp.CSS(`#pending tr[data-id="`+toCancel+`"]`)))
	waitJS("its actions", `!!document.querySelector("#cancel")`)
	run("ask to cancel", chromedp.Click(chromedp.CSS("#cancel")))
	waitJS("the confirmation", `!!document.querySelector("#cancel-confirm")`)
	shot("pending-cancel-confirm")
	ps, err := c.PendingMessages(ctx, wharf.PendingFilter{IDs: []string{toCancel}})
	require.NoError(t, err)
	require.Len(t, ps, 1, "asking is not cancelling")
	run("confirm", chromedp.Click(chromedp.CSS("#cancel-confirm")))
	waitJS("the list without it", `document.querySelectorAll("#pending tr[data-id]").length === 0`)
	require.True(t, time.Now().Before(soon), "the cancel came after the message was due: the test cannot tell it was never delivered")
	ps, err = c.PendingMessages(ctx, wharf.PendingFilter{IDs: []string{toCancel}})
	require.NoError(t, err)
	require.Empty(t, ps)
	noErrors("pending cancel")

	// Dead letters: retry one by clicking; the relay delivers it.
	gotoPage("dead", `document.querySelectorAll("#dead tr[data-id]").length === 2`)
	require.Contains(t, eval(`document.querySelector("#dead").textContent`), "payload rejected: <b>bad amount</b>")
	run("select the first", chromedp.Click(chromedp.CSS(`#dead tr[data-id="`+deadRetry+`"]`)))
	waitJS("its detail", `!!document.querySelector("#retry") && document.querySelector("#headers").textContent.includes("<script>x</script>")`)
	noErrors("dead letters")
	shot("dead")
	run("retry it", chromedp.Click(chromedp.CSS("#retry")))
	waitJS("the list without it", `document.querySelectorAll("#dead tr[data-id]").length === 1`)
	require.Eventually(t, func() bool { return rec.has(deadRetry) }, 60*time.Second, 50*time.Millisecond, "the retried dead letter is delivered")

	// Purge the other, with the confirmation.
	run("select the other", chromedp.Click(chromedp.CSS(`#dead tr[data-id="`+deadPurge+`"]`)))
	waitJS("its detail", `!!document.querySelector("#purge") && document.querySelector("#payload").textContent === "3q2+7w=="`)
	run("ask to purge", chromedp.Click(chromedp.CSS("#purge")))
	waitJS("the confirmation", `!!document.querySelector("#purge-confirm")`)
	ds, err := c.DeadLetters(ctx, wharf.DeadLetterFilter{})
	require.NoError(t, err)
	require.Len(t, ds, 1, "asking is not purging")
	run("confirm", chromedp.Click(chromedp.CSS("#purge-confirm")))
	waitJS("no dead letter left", `document.querySelectorAll("#dead tr[data-id]").length === 0`)
	ds, err = c.DeadLetters(ctx, wharf.DeadLetterFilter{})
	require.NoError(t, err)
	require.Empty(t, ds)
	require.False(t, rec.has(deadPurge))
	noErrors("dead letters retry and purge")

	// The control reminder is delivered when due; the cancelled one never.
	require.Eventually(t, func() bool { return rec.has(control) }, 120*time.Second, 100*time.Millisecond, "the control reminder is delivered")
	require.False(t, rec.has(toCancel), "the cancelled reminder was delivered")

	// Flows: the counts, the failed payout found from its count, its page
	// (error and state as text), and a retry by clicking that the runner
	// then finishes.
	gotoPage("flows", `!!document.querySelector('#flow-counts tr[data-flow="payout"] a[data-status="failed"]') && document.querySelectorAll("#flow-instances tr[data-id]").length === 4`)
	require.Contains(t, eval(`document.querySelector('#flow-counts tr[data-flow="checkout"] a[data-status="awaiting"]').textContent`), "3")
	run("filter by the failed count", chromedp.Click(chromedp.CSS(`#flow-counts tr[data-flow="payout"] a[data-status="failed"]`)))
	waitJS("the failed payout alone", `document.querySelectorAll("#flow-instances tr[data-id]").length === 1 && !!document.querySelector('#flow-instances tr[data-id="`+strconv.FormatInt(failedFlow, 10)+`"]')`)
	require.Equal(t, "failed", eval(`document.querySelector("#flow-filter-status").value`))
	require.Contains(t, eval(`document.querySelector("#flow-instances").textContent`), "bank refused: <b>insufficient funds</b>")
	noErrors("flows")
	shot("flows")
	run("open the instance", chromedp.Click(chromedp.CSS(`#flow-instances tr[data-id="`+strconv.FormatInt(failedFlow, 10)+`"]`)))
	waitJS("its page", `document.body.dataset.page === "flow" && document.body.dataset.loaded === "1" && !!document.querySelector("#flow-retry")`)
	require.Equal(t, "failed", eval(`document.querySelector("#flow-status").textContent`))
	require.Equal(t, "bank refused: <b>insufficient funds</b>", eval(`document.querySelector("#flow-error").textContent`))
	require.Contains(t, eval(`document.querySelector("#flow-state").textContent`), `"note": `+strconv.Quote(badNote))
	require.Contains(t, eval(`document.querySelector("#flow-steps").textContent`), "fail")
	require.Equal(t, "0", eval(`String(document.querySelectorAll("#main img, #main b").length)`))
	noErrors("flow instance")
	shot("flow")
	fx.pay.Store(true)
	run("retry it", chromedp.Click(chromedp.CSS("#flow-retry")))
	waitJS("the instance done", `document.querySelector("#flow-status").textContent === "done" && !document.querySelector("#flow-retry")`)
	d, err := fx.client.Get(ctx, failedFlow)
	require.NoError(t, err)
	require.Equal(t, "done", d.Status)
	require.Len(t, d.Steps, 2)
	require.Equal(t, []string{"send", "send"}, []string{d.Steps[0].Step, d.Steps[1].Step}, "the retry ran the failed step again")
	require.Equal(t, []string{"fail", "done"}, []string{d.Steps[0].Outcome, d.Steps[1].Outcome})
	require.Equal(t, 0, d.Steps[1].Attempt)
	noErrors("flow retry")

	// Send the awaited signal from the form: the checkout resumes, ships
	// its item in a child and ends.
	run("open the second checkout", chromedp.Evaluate[chromedp.Void](`location.hash = "#/flow?id=`+strconv.FormatInt(toSignal, 10)+`"`))
	waitJS("its page", `document.body.dataset.page === "flow" && document.body.dataset.loaded === "1" && !!document.querySelector("#signal-send")`)
	require.Equal(t, "payment-captured", eval(`document.querySelector("#signal-name").value`), "the form offers the awaited signal")
	run("send the signal", setValue("#signal-payload", `{"cents": 1999}`), setValue("#signal-dedup", "psp-evt-7"), chromedp.Click(chromedp.CSS("#signal-send")))
	waitJS("the checkout done with its child", `document.querySelector("#flow-status").textContent === "done" && document.querySelectorAll("#flow-children tr[data-id]").length === 1 && document.querySelectorAll("#flow-signals tr[data-signal]").length === 1`)
	d, err = fx.client.Get(ctx, toSignal)
	require.NoError(t, err)
	require.Equal(t, "done", d.Status)
	require.Len(t, d.Signals, 1)
	require.JSONEq(t, `{"cents": 1999}`, string(d.Signals[0].Payload))
	require.Equal(t, "psp-evt-7", d.Signals[0].DedupKey)
	require.Equal(t, "paid", d.Signals[0].ConsumedStep)
	noErrors("flow signal")

	// Cancel another, with the confirmation.
	run("open the third checkout", chromedp.Evaluate[chromedp.Void](`location.hash = "#/flow?id=`+strconv.FormatInt(toCancelFlow, 10)+`"`))
	waitJS("its page", `document.body.dataset.page === "flow" && document.body.dataset.loaded === "1" && !!document.querySelector("#flow-cancel")`)
	run("ask to cancel", chromedp.Click(chromedp.CSS("#flow-cancel")))
	waitJS("the confirmation", `!!document.querySelector("#flow-cancel-confirm")`)
	require.Equal(t, "awaiting", fx.status(toCancelFlow), "asking is not cancelling")
	run("confirm", chromedp.Click(chromedp.CSS("#flow-cancel-confirm")))
	waitJS("the checkout cancelled", `document.querySelector("#flow-status").textContent === "cancelled" && !document.querySelector("#flow-cancel") && !document.querySelector("#signal-send")`)
	require.Equal(t, "cancelled", fx.status(toCancelFlow))
	noErrors("flow cancel")

	// Retry every failed instance listed, with the confirmation.
	fx.pay.Store(false)
	more := []int64{
		fx.start(fx.payout.Start(payoutState{Cents: 1}, wharfflow.StartOptions{Key: "payout-8"})),
		fx.start(fx.payout.Start(payoutState{Cents: 2}, wharfflow.StartOptions{Key: "payout-9"})),
	}
	for _, id := range more {
		fx.waitStatus(id, "failed")
	}
	fx.pay.Store(true)
	gotoPage("flows", `!!document.querySelector('#flow-counts tr[data-flow="payout"] a[data-status="failed"]')`)
	// The page remembers the last filter (payout, failed: set above), so
	// its first list may already show the two; wait for the list that
	// answers the click, or the click's render would replace the buttons
	// the next steps click.
	renders := eval(`document.body.dataset.flowList || "0"`)
	run("filter by the failed count", chromedp.Click(chromedp.CSS(`#flow-counts tr[data-flow="payout"] a[data-status="failed"]`)))
	waitJS("the two failed payouts", `Number(document.body.dataset.flowList) > `+renders+` && document.querySelectorAll("#flow-instances tr[data-id]").length === 2 && !!document.querySelector("#flow-retry-all")`)
	run("ask to retry them", chromedp.Click(chromedp.CSS("#flow-retry-all")))
	waitJS("the confirmation", `!!document.querySelector("#flow-retry-all-confirm")`)
	require.Equal(t, "failed", fx.status(more[0]), "asking is not retrying")
	run("confirm", chromedp.Click(chromedp.CSS("#flow-retry-all-confirm")))
	waitJS("no failed payout listed", `document.querySelectorAll("#flow-instances tr[data-id]").length === 0`)
	for _, id := range more {
		fx.waitStatus(id, "done")
	}
	noErrors("flow retry all")

	// Read-only: its own login (the cookie is per mount), no buttons, and
	// changes refused even when asked directly.
	rec.mu.Lock()
	rec.failing["*"] = true
	rec.mu.Unlock()
	ro := enqueueOne(t, c, wharf.Message{Topic: "payments", Key: "pay-3", Payload: []byte(`{}`)})
	require.Eventually(t, func() bool {
		ds, err := c.DeadLetters(ctx, wharf.DeadLetterFilter{IDs: []string{ro}})
		return err == nil && len(ds) == 1
	}, 60*time.Second, 50*time.Millisecond)
	run("open the read-only console", chromedp.Navigate(srv.URL+"/ro/"))
	waitJS("its login page", `location.pathname === "/ro/login" && !!document.querySelector("#token")`)
	run("log in", setValue("#token", token), chromedp.Click(chromedp.CSS("#login-submit")))
	waitJS("the overview", `location.pathname === "/ro/" && document.body.dataset.loaded === "1"`)
	gotoPage("dead", `document.querySelectorAll("#dead tr[data-id]").length === 1`)
	run("select it", chromedp.Click(chromedp.CSS(`#dead tr[data-id="`+ro+`"]`)))
	waitJS("its detail", `!!document.querySelector("#read-only-note")`)
	require.Equal(t, "0", eval(`String(document.querySelectorAll("#retry, #purge, #retry-all, #purge-all").length)`))
	require.Contains(t, eval(`document.querySelector("#meta").textContent`), "read-only")
	noErrors("read-only dead letters")
	shot("dead-read-only")
	gotoPage("pending", `document.querySelectorAll("#pending tr[data-id]").length > 0`)
	run("select a message", chromedp.Click(chromedp.CSS(`#pending tr[data-id]`)))
	waitJS("its detail", `!!document.querySelector("#read-only-note")`)
	require.Equal(t, "0", eval(`String(document.querySelectorAll("#cancel, #reschedule, #deliver-now").length)`))
	run("open a flow instance", chromedp.Evaluate[chromedp.Void](`location.hash = "#/flow?id=`+strconv.FormatInt(awaitingFlow, 10)+`"`))
	waitJS("its page", `document.body.dataset.page === "flow" && document.body.dataset.loaded === "1" && !!document.querySelector("#read-only-note")`)
	require.Equal(t, "awaiting", eval(`document.querySelector("#flow-status").textContent`))
	require.Equal(t, "0", eval(`String(document.querySelectorAll("#flow-retry, #flow-cancel, #signal-send, #flow-signal-form").length)`))
	noErrors("read-only flow instance")
	sctx, cancel := context.WithTimeout(bctx, 60*time.Second)
	status, err := chromedp.Run(sctx, chromedp.Evaluate[int](`fetch("api/dead/retry", {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify({ids: [`+jsString(ro)+`]})}).then(r => r.status)`, chromedp.EvalAwaitPromise))
	cancel()
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, status)
	perrs.take() // the browser logs the refused request
	ds, err = c.DeadLetters(ctx, wharf.DeadLetterFilter{IDs: []string{ro}})
	require.NoError(t, err)
	require.Len(t, ds, 1, "read-only changed nothing")

	// A console without flows says so on the Flows page.
	run("open a console without flows", chromedp.Navigate(srv.URL+"/noflows/#/flows"))
	waitJS("its Flows page", `document.body.dataset.page === "flows" && document.body.dataset.loaded === "1" && !!document.querySelector("#flows-missing")`)
	require.Contains(t, eval(`document.querySelector("#flows-missing").textContent`), "started without flows")
	noErrors("console without flows")

	// Screenshots for the README, on request only.
	if os.Getenv(updateScreenshotsEnv) == "1" {
		for _, name := range []string{"overview", "blocked", "dead", "flows", "flow"} {
			b, err := os.ReadFile(filepath.Join(dir, name+".png"))
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join("..", "docs", "img", "console-"+name+".png"), b, 0o644))
		}
		t.Logf("docs/img/console-{overview,blocked,dead,flows,flow}.png updated")
	}
	t.Logf("screenshots in %s", dir)
}

// setValue sets an input's value (chromedp.SetValue refuses "").
func setValue(sel, v string) chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](`document.querySelector(` + jsString(sel) + `).value = ` + jsString(v))
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "<", `\x3c`)
	return `"` + r.Replace(s) + `"`
}
