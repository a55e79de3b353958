package lab

// kwokStages is the scale lab's KWOK configuration: how KWOK plays the
// kubelet of its simulated nodes. A node becomes Ready at once, with the
// InternalIP the scale run gave it (annotation scaleNodeIPAnnotation). A
// pod of the run (label scaleLabel) becomes Running once kvnet has
// allocated its addresses (its kvnet.io/pod-networks annotation is
// there), as a kubelet's CNI ADD waits for them; any other pod at once.
// A pod being deleted is deleted (grace period 0), as a kubelet confirms
// a deletion once the pod's network is torn down.
const kwokStages = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: kvnet-scale-node-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'NotIn'
      values: ['Running']
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - type: Ready
        status: "True"
        reason: KubeletReady
        message: simulated by KWOK for kvnet's scale lab
        lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
      addresses:
      - type: InternalIP
        address: {{ index .metadata.annotations "scale.kvnet.io/node-ip" | Quote }}
      - type: Hostname
        address: {{ .metadata.name | Quote }}
      allocatable:
        cpu: 1k
        memory: 1Ti
        pods: 1M
      capacity:
        cpu: 1k
        memory: 1Ti
        pods: 1M
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: kvnet-scale-pod-running
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Pending']
    - key: 'if .metadata.labels["kvnet-scale"] then .metadata.annotations["kvnet.io/pod-networks"] != null else true end'
      operator: 'In'
      values: ['true']
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - type: Initialized
        status: "True"
        lastTransitionTime: {{ $now | Quote }}
      - type: Ready
        status: "True"
        lastTransitionTime: {{ $now | Quote }}
      - type: ContainersReady
        status: "True"
        lastTransitionTime: {{ $now | Quote }}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: true
        restartCount: 0
        started: true
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
      {{ with PodIPsWith .spec.nodeName false .metadata.uid .metadata.name .metadata.namespace }}
      podIP: {{ index . 0 | Quote }}
      podIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      phase: Running
      startTime: {{ $now | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: kvnet-scale-pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
  next:
    delete: true
`
