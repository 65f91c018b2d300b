package main

// The rank processes serve Prometheus metrics when GOCOLL_METRICS_ADDR is
// set (README, "Metrics and logs"): linking package metrics is what makes
// the variable work, since the dispatcher never imports it.
import _ "github.com/gocoll/gocoll/metrics"
