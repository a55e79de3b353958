// Package libnbd is the real cluster's stand-in for libguestfs.org/libnbd
// (see go.mod): the names KubeVirt's virt-launcher uses, every call
// failing with ErrUnavailable.
package libnbd

import "errors"

// ErrUnavailable is what every call returns.
var ErrUnavailable = errors.New("libnbd is not available in kvnet's lab build of KubeVirt (hack/tools/kubevirt/libnbd): VM backup and NBD export are not supported")

// Metadata contexts and extent flags of the NBD protocol.
const (
	CONTEXT_BASE_ALLOCATION   = "base:allocation"
	CONTEXT_QEMU_DIRTY_BITMAP = "qemu:dirty-bitmap:"

	STATE_HOLE  = uint32(1)
	STATE_ZERO  = uint32(2)
	STATE_DIRTY = uint32(1)
)

// LibnbdExtent is one extent of a block status reply.
type LibnbdExtent struct {
	Length uint64
	Flags  uint64
}

// ExtentCallback64 receives the extents of a block status reply.
type ExtentCallback64 func(metacontext string, offset uint64, entries []LibnbdExtent, err *int) int

// BlockStatus64Optargs and PreadOptargs are the calls' optional arguments.
type (
	BlockStatus64Optargs struct{}
	PreadOptargs         struct{}
)

// Libnbd is a handle; Create never returns one.
type Libnbd struct{}

// Create fails with ErrUnavailable.
func Create() (*Libnbd, error) { return nil, ErrUnavailable }

func (*Libnbd) Close() error                              { return nil }
func (*Libnbd) AddMetaContext(string) error               { return ErrUnavailable }
func (*Libnbd) CanMetaContext(string) (bool, error)       { return false, ErrUnavailable }
func (*Libnbd) GetSize() (uint64, error)                  { return 0, ErrUnavailable }
func (*Libnbd) SetExportName(string) error                { return ErrUnavailable }
func (*Libnbd) ConnectUnix(string) error                  { return ErrUnavailable }
func (*Libnbd) Pread([]byte, uint64, *PreadOptargs) error { return ErrUnavailable }
func (*Libnbd) BlockStatus64(uint64, uint64, ExtentCallback64, *BlockStatus64Optargs) error {
	return ErrUnavailable
}
