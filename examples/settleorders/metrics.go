package main

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// metrics is what one scrape showed of the metrics the operations team
// watches (package leaseprom's).
type metrics struct {
	// Answered is false when the scrape got no answer (Error says why):
	// a frozen process answers nothing, as Prometheus's up == 0 would show.
	Answered bool   `json:"answered"`
	Error    string `json:"error,omitempty"`
	// JobRunning is fencekit_job_running{lease="settle-orders"}: this
	// process runs the job.
	JobRunning float64 `json:"job_running"`
	// LeaseHeld is fencekit_lease_held, Lost the sum of
	// fencekit_lease_lost_total.
	LeaseHeld float64 `json:"lease_held"`
	Lost      float64 `json:"lost"`
	// Writes is fencekit_guard_writes_total summed over the classes, by
	// "guard outcome" ("dbguard stale").
	Writes map[string]float64 `json:"writes"`
}

// sample is one reading of every replica's /metrics.
type sample struct {
	At time.Time `json:"at"`
	// Kind is one of the sample* constants; Moment says it in words.
	Kind     string             `json:"kind"`
	Moment   string             `json:"moment"`
	Replicas map[string]metrics `json:"replicas"`
}

// scrapeTimeout bounds one scrape; a frozen replica takes all of it.
const scrapeTimeout = time.Second

// scrape reads the metrics the replica serves at url, as Prometheus would.
func scrape(ctx context.Context, url string) metrics {
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return metrics{Error: err.Error()}
	}
	req.Header.Set("Accept", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return metrics{Error: fmt.Sprintf("no answer within %v", scrapeTimeout)}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return metrics{Error: resp.Status}
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return metrics{Error: err.Error()}
	}
	return read(slices.Collect(maps.Values(mfs)))
}

// read picks the metrics out of the families mfs.
func read(mfs []*dto.MetricFamily) metrics {
	m := metrics{Answered: true, Writes: map[string]float64{}}
	for _, mf := range mfs {
		for _, x := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range x.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch mf.GetName() {
			case "fencekit_job_running":
				if labels["lease"] == job {
					m.JobRunning = x.GetGauge().GetValue()
				}
			case "fencekit_lease_held":
				m.LeaseHeld = x.GetGauge().GetValue()
			case "fencekit_lease_lost_total":
				m.Lost += x.GetCounter().GetValue()
			case "fencekit_guard_writes_total":
				m.Writes[labels["guard"]+" "+labels["outcome"]] += x.GetCounter().GetValue()
			}
		}
	}
	return m
}

// takeSample scrapes every replica's /metrics, all at once (a frozen one
// takes scrapeTimeout to give up on).
func takeSample(ctx context.Context, kind, moment string, urls map[string]string) sample {
	s := sample{At: time.Now(), Kind: kind, Moment: moment, Replicas: map[string]metrics{}}
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for name, url := range urls {
		wg.Go(func() {
			m := scrape(ctx, url)
			mu.Lock()
			s.Replicas[name] = m
			mu.Unlock()
		})
	}
	wg.Wait()
	return s
}

// jobRunningSum is the job gauge summed over the replicas that answered.
func (s sample) jobRunningSum() float64 {
	var sum float64
	for _, m := range s.Replicas {
		sum += m.JobRunning
	}
	return sum
}
