//go:build tools

// Package crds names the operators' API types that controller-gen turns into CRDs, so they are in this module.
package crds

import (
	_ "github.com/kubeflow/spark-operator/v2/api/v1beta2"
	_ "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
)
