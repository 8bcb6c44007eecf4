#pragma once
/// Which of this host's network interfaces Gloo binds to. PyTorch takes the address the host's
/// name resolves to, which is loopback on a default Debian install (127.0.1.1) and makes every
/// multi-host job fail with "Connection refused"; Lockstep instead takes the interface whose
/// address routes to the job's main address. GLOO_SOCKET_IFNAME still overrides it.

#include <chrono>
#include <string>
#include <vector>

namespace lockstep {
namespace distributed {

/// An interface of this host and the address Gloo binds to on it.
struct GlooInterface {
  std::string name;     // "eth0", "lo"
  std::string address;  // "10.0.0.2"
  std::string why;      // "GLOO_SOCKET_IFNAME", "routes to 10.0.0.1", "the main address is loopback"

  /// "eth0 (10.0.0.2; routes to 10.0.0.1)".
  std::string describe() const;
};

/// Whether `address` (numeric) is a loopback address: 127.x.x.x or ::1.
bool is_loopback_address(const std::string& address);

/// The interface Gloo uses to reach the ranks of a job whose main address is `main_address`:
/// GLOO_SOCKET_IFNAME's when set, loopback for a loopback main address, else the one the kernel
/// sends packets for `main_address` from (no packet is sent). Throws DistributedError when
/// `main_address` does not resolve, no route leads to it, or GLOO_SOCKET_IFNAME names no interface
/// with an IPv4 or IPv6 address.
GlooInterface gloo_interface(const std::string& main_address);

/// For each of `addresses` (numeric), whether its host answers a TCP connection attempt on `port`
/// within `wait`, with a connection or a refusal: a host behind a cut link, gone, or behind a
/// firewall that drops packets does not. All are tried at once.
std::vector<bool> hosts_answering(const std::vector<std::string>& addresses, int port,
                                  std::chrono::milliseconds wait);

}  // namespace distributed
}  // namespace lockstep
