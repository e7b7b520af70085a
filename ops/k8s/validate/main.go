// Command validate checks the manifests of ops/k8s without a cluster
// (`ci/image.sh k8s` runs it; no Kubernetes API server can be started on
// the development machine): every document of the YAML streams given as
// arguments (the output of `kubectl kustomize`) is decoded strictly into
// the Go type the API server would decode it into — Kubernetes' own
// k8s.io/api types, the Prometheus Operator's and KEDA's — so an unknown or
// misspelt field, a wrong type or an unparsable quantity fails; then the
// checks the API server's validation makes that a static reading can:
// names and labels, a StatefulSet's selector against its pod labels, env
// var names, named ports the probes use.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	keda "github.com/kedacore/keda/v2/apis/keda/v1alpha1"
	monitoring "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	k8syaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// newObject returns the typed object for a document's apiVersion and kind.
func newObject(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1 Secret":
		return &corev1.Secret{}, nil
	case "v1 Service":
		return &corev1.Service{}, nil
	case "apps/v1 StatefulSet":
		return &appsv1.StatefulSet{}, nil
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "monitoring.coreos.com/v1 PodMonitor":
		return &monitoring.PodMonitor{}, nil
	case "monitoring.coreos.com/v1 PrometheusRule":
		return &monitoring.PrometheusRule{}, nil
	case "keda.sh/v1alpha1 ScaledObject":
		return &keda.ScaledObject{}, nil
	case "keda.sh/v1alpha1 TriggerAuthentication":
		return &keda.TriggerAuthentication{}, nil
	}
	return nil, fmt.Errorf("no type known for apiVersion %q kind %q", apiVersion, kind)
}

func checkMeta(m *metav1.ObjectMeta) []string {
	var errs []string
	for _, e := range validation.IsDNS1123Subdomain(m.Name) {
		errs = append(errs, "metadata.name "+m.Name+": "+e)
	}
	for _, set := range []map[string]string{m.Labels} {
		for k, v := range set {
			for _, e := range validation.IsQualifiedName(k) {
				errs = append(errs, "label key "+k+": "+e)
			}
			for _, e := range validation.IsValidLabelValue(v) {
				errs = append(errs, "label "+k+" value "+v+": "+e)
			}
		}
	}
	for k := range m.Annotations {
		for _, e := range validation.IsQualifiedName(k) {
			errs = append(errs, "annotation key "+k+": "+e)
		}
	}
	return errs
}

func checkPod(meta *metav1.ObjectMeta, selector *metav1.LabelSelector, spec *corev1.PodSpec) []string {
	var errs []string
	sel, err := metav1.LabelSelectorAsSelector(selector)
	if err != nil {
		errs = append(errs, "selector: "+err.Error())
	} else if sel.Empty() || !sel.Matches(labels.Set(meta.Labels)) {
		errs = append(errs, "selector "+sel.String()+" does not match the pod template's labels")
	}
	errs = append(errs, checkMeta(&metav1.ObjectMeta{Name: "template", Labels: meta.Labels, Annotations: meta.Annotations})...)
	volumes := map[string]bool{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = true
	}
	if len(spec.Containers) == 0 {
		errs = append(errs, "no containers")
	}
	for _, c := range spec.Containers {
		ports := map[string]bool{}
		for _, p := range c.Ports {
			if p.Name != "" {
				for _, e := range validation.IsValidPortName(p.Name) {
					errs = append(errs, "port name "+p.Name+": "+e)
				}
				ports[p.Name] = true
			}
		}
		for _, e := range c.Env {
			for _, m := range validation.IsEnvVarName(e.Name) {
				errs = append(errs, "env "+e.Name+": "+m)
			}
			if e.Value != "" && e.ValueFrom != nil {
				errs = append(errs, "env "+e.Name+": both value and valueFrom")
			}
		}
		for name, p := range map[string]*corev1.Probe{"livenessProbe": c.LivenessProbe, "readinessProbe": c.ReadinessProbe, "startupProbe": c.StartupProbe} {
			if p != nil && p.HTTPGet != nil && p.HTTPGet.Port.StrVal != "" && !ports[p.HTTPGet.Port.StrVal] {
				errs = append(errs, fmt.Sprintf("container %s %s: no port named %q", c.Name, name, p.HTTPGet.Port.StrVal))
			}
		}
		for _, m := range c.VolumeMounts {
			if !volumes[m.Name] {
				errs = append(errs, fmt.Sprintf("container %s mounts unknown volume %q", c.Name, m.Name))
			}
		}
	}
	return errs
}

// check decodes one document strictly and runs the static checks.
func check(doc []byte) (string, []string, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return "", nil, err
	}
	obj, err := newObject(tm.APIVersion, tm.Kind)
	if err != nil {
		return "", nil, err
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return "", nil, fmt.Errorf("%s %s: %w", tm.APIVersion, tm.Kind, err)
	}
	var errs []string
	var name string
	switch o := obj.(type) {
	case *appsv1.StatefulSet:
		name = o.Name
		errs = append(errs, checkMeta(&o.ObjectMeta)...)
		errs = append(errs, checkPod(&o.Spec.Template.ObjectMeta, o.Spec.Selector, &o.Spec.Template.Spec)...)
		if o.Spec.ServiceName == "" {
			errs = append(errs, "spec.serviceName is empty")
		}
	case *policyv1.PodDisruptionBudget:
		name = o.Name
		errs = append(errs, checkMeta(&o.ObjectMeta)...)
		if (o.Spec.MinAvailable == nil) == (o.Spec.MaxUnavailable == nil) {
			errs = append(errs, "exactly one of minAvailable and maxUnavailable")
		}
	default:
		// Every other type embeds ObjectMeta as "metadata".
		var m struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
		}
		raw, _ := json.Marshal(obj)
		_ = json.Unmarshal(raw, &m)
		name = m.Metadata.Name
		errs = append(errs, checkMeta(&m.Metadata)...)
	}
	return fmt.Sprintf("%s %s %s", tm.APIVersion, tm.Kind, name), errs, nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: validate FILE.yaml...")
		os.Exit(2)
	}
	failed := false
	for _, path := range os.Args[1:] {
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		r := k8syaml.NewYAMLReader(bufio.NewReader(f))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
				os.Exit(2)
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			what, errs, err := check(doc)
			if err != nil {
				fmt.Printf("FAIL %s: %v\n", path, err)
				failed = true
				continue
			}
			for _, e := range errs {
				fmt.Printf("FAIL %s: %s: %s\n", path, what, e)
				failed = true
			}
			if len(errs) == 0 {
				fmt.Printf("ok   %s: %s\n", path, what)
			}
		}
		f.Close()
	}
	if failed {
		os.Exit(1)
	}
}
