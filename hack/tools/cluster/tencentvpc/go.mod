// A stand-in for github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc
// v1.0.1177, which flanneld v0.27.0 imports for its Tencent Cloud backend
// and whose zip the Go module proxy refuses. The real cluster never uses
// that backend; hack/tools/cluster/go.mod replaces the module with this
// one so that flanneld builds. Every call fails.
module github.com/tencentcloud/tencentcloud-sdk-go/tencentcloud/vpc

go 1.23
