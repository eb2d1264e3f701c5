package validate

import (
	"testing"

	"github.com/prometheus/prometheus/model/rulefmt"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

func TestX(t *testing.T) {
	var d appsv1.Deployment
	_ = yaml.UnmarshalStrict(nil, &d)
	_ = rulefmt.RuleGroups{}
}
