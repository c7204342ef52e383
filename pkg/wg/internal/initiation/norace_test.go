//go:build !race

package initiation

const raceEnabled = false
