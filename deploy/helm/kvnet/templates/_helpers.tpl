{{/*
kvnet.image: the image reference of component (index . 1) from the
values image.registry and image.tag, as kvnet install --registry --tag
names it.
*/}}
{{- define "kvnet.image" -}}
{{- $root := index . 0 -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $root.Values.image.registry) (index . 1) $root.Values.image.tag -}}
{{- end -}}

{{/*
kvnet.settings: the data of create-only ConfigMap (index . 1) in
kvnet-system. kvnet install creates these ConfigMaps once and never
changes them after, so that an upgrade keeps what the admin set there; the
chart does the same: from the values (index . 2) while the ConfigMap does
not exist, as the cluster has it once it does (helm template and
--dry-run, which read no cluster, render the values).
*/}}
{{- define "kvnet.settings" -}}
{{- $root := index . 0 -}}
{{- $values := index $root.Values (index . 2) | default dict -}}
{{- $data := $values -}}
{{- $live := lookup "v1" "ConfigMap" "kvnet-system" (index . 1) -}}
{{- if $live -}}
{{- $data = $live.data | default dict -}}
{{- end -}}
{{- $out := dict -}}
{{- range $k, $v := $data -}}
{{- $_ := set $out $k (toString $v) -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
kvnet.checkReleaseNamespace: the chart creates namespace kvnet-system
itself, with the Pod Security labels kvnet-node needs, so the release
must live in another namespace.
*/}}
{{- define "kvnet.checkReleaseNamespace" -}}
{{- if eq .Release.Namespace "kvnet-system" -}}
{{- fail "release namespace kvnet-system: the chart creates namespace kvnet-system itself (with the Pod Security labels kvnet-node needs); install the release into another namespace, e.g. helm install kvnet deploy/helm/kvnet --namespace kube-system" -}}
{{- end -}}
{{- end -}}

{{/*
kvnet.checkMonitoringCRDs: monitoring.enabled needs the Prometheus
Operator's kinds, as kvnet install --monitoring does.
*/}}
{{- define "kvnet.checkMonitoringCRDs" -}}
{{- range list "ServiceMonitor" "PodMonitor" "PrometheusRule" -}}
{{- if not ($.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .)) -}}
{{- fail (printf "monitoring.enabled=true: the cluster does not serve %s (monitoring.coreos.com/v1); install the Prometheus Operator (kube-prometheus) first, or scrape kvnet-controller (port 8080) and kvnet-node (port 9464) yourself" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
