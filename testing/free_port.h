#pragma once
// A loopback TCP port free a moment ago: bound with the kernel's choice, then closed. For tests that
// must give several launchers the same --master-port (another process may take it in between: a
// rare flake, which is why the launcher's own tests otherwise let it pick).
namespace zero::testing {

int free_port();

}  // namespace zero::testing
