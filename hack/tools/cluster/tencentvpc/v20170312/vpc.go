// Package v20170312 has the shape of the Tencent Cloud VPC client that
// flanneld's tencentvpc backend calls, and nothing behind it: every call
// returns ErrNotBuilt. It exists only so that flanneld builds from the Go
// module proxy (see ../go.mod); the kvnet-lab cluster runs the vxlan
// backend.
package v20170312

import "errors"

// ErrNotBuilt is what every call returns.
var ErrNotBuilt = errors.New("tencent cloud VPC backend not built into this flanneld (kvnet-lab stand-in module)")

// Client is a VPC API client that cannot call anything.
type Client struct{}

// NewClientWithSecretId returns a client whose every call fails.
func NewClientWithSecretId(secretID, secretKey, region string) (*Client, error) { //nolint:revive // the SDK's name
	return &Client{}, ErrNotBuilt
}

// Filter filters a describe call.
type Filter struct {
	Name   *string
	Values []*string
}

// Route is one route of a route table.
type Route struct {
	DestinationCidrBlock *string
	GatewayType          *string
	GatewayId            *string //nolint:revive // the SDK's name
	RouteId              *uint64 //nolint:revive // the SDK's name
	RouteType            *string
	Enabled              *bool
}

// RouteTable is a VPC route table.
type RouteTable struct {
	RouteTableId *string //nolint:revive // the SDK's name
	RouteSet     []*Route
}

// DescribeRouteTablesRequest asks for route tables.
type DescribeRouteTablesRequest struct{ Filters []*Filter }

// DescribeRouteTablesResponse is never returned.
type DescribeRouteTablesResponse struct {
	Response *struct{ RouteTableSet []*RouteTable }
}

// CreateRoutesRequest asks to create routes.
type CreateRoutesRequest struct {
	RouteTableId *string //nolint:revive // the SDK's name
	Routes       []*Route
}

// CreateRoutesResponse is never returned.
type CreateRoutesResponse struct{}

// DeleteRoutesRequest asks to delete routes.
type DeleteRoutesRequest struct {
	RouteTableId *string //nolint:revive // the SDK's name
	Routes       []*Route
}

// DeleteRoutesResponse is never returned.
type DeleteRoutesResponse struct{}

// NewDescribeRouteTablesRequest returns an empty request.
func NewDescribeRouteTablesRequest() *DescribeRouteTablesRequest {
	return &DescribeRouteTablesRequest{}
}

// NewCreateRoutesRequest returns an empty request.
func NewCreateRoutesRequest() *CreateRoutesRequest { return &CreateRoutesRequest{} }

// NewDeleteRoutesRequest returns an empty request.
func NewDeleteRoutesRequest() *DeleteRoutesRequest { return &DeleteRoutesRequest{} }

// DescribeRouteTables fails.
func (*Client) DescribeRouteTables(*DescribeRouteTablesRequest) (*DescribeRouteTablesResponse, error) {
	return nil, ErrNotBuilt
}

// CreateRoutes fails.
func (*Client) CreateRoutes(*CreateRoutesRequest) (*CreateRoutesResponse, error) {
	return nil, ErrNotBuilt
}

// DeleteRoutes fails.
func (*Client) DeleteRoutes(*DeleteRoutesRequest) (*DeleteRoutesResponse, error) {
	return nil, ErrNotBuilt
}
