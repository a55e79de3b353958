package testenv

import (
	"os"

	"go.uber.org/zap/zapcore"
)

// zapLevel is the controller log level in tests: errors only, unless
// KVNET_TEST_VERBOSE is set.
func zapLevel() zapcore.Level {
	if os.Getenv("KVNET_TEST_VERBOSE") != "" {
		return zapcore.DebugLevel
	}
	return zapcore.ErrorLevel
}
