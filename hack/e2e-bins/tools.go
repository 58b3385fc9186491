//go:build tools

// Package tools pins what hack/build-e2e.sh builds from the Go module proxy: Kubernetes'
// end-to-end test binary (built with `go test -c`), its agnhost test image's program, and the
// ginkgo CLI that runs the test binary's specs in parallel. The versions are go.mod's.
package tools

import (
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
