//go:build tools

// Package operator names the Spark Operator's command, so its module and theirs are in this one.
package operator

import _ "github.com/kubeflow/spark-operator/v2/cmd/operator"
