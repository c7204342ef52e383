//go:build race

package initiation

const raceEnabled = true
