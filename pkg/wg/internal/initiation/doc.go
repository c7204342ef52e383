// Package initiation identifies the sender of a WireGuard handshake
// initiation as the receiving device, without wireguard-go: it checks the
// message's shape and MAC1 and decrypts the initiator's static public key
// with the device's private key (the first steps of the responder's side of
// Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s, as the WireGuard whitepaper
// describes them). pkg/wg uses it on the lazy-peer path: a peer kept out of
// the in-process wireguard-go device is put into it when its first
// handshake initiation arrives, before wireguard-go processes the packet.
//
// The sender it returns has proved that it holds its private key: besides
// the static key, which anyone knowing the receiver's public key can seal
// naming any sender, it checks that the encrypted timestamp opens with the
// static-static key (DH of the two static keys). An old initiation replayed
// still names its sender: SenderAt returns its timestamp, which the caller
// compares with the last one it saw from that sender, since wireguard-go
// forgets a peer's last timestamp when the peer leaves the device.
//
// Out of scope: completing handshakes (the preshared key, the response),
// cookies and MAC2, and the replay protection of a peer in the device:
// wireguard-go does all that.
package initiation
