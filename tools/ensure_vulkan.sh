#!/usr/bin/env bash
# Makes sure Mesa's software Vulkan driver (lavapipe) and the Vulkan loader are installed: the
# compiled-mode tests run `vulkan-spirv` modules on it through IREE's `vulkan` driver.
#
# Fast and silent when both are present (checked by their files, so any distribution that
# ships them counts). Otherwise installs Debian's `mesa-vulkan-drivers libvulkan1` with
# apt-get, refreshing the package lists only when the install fails without them. Waits for a
# dpkg lock another install holds instead of failing. Without apt-get it says what is missing
# and exits 0: the Vulkan tests then fail with the same explanation.
set -euo pipefail

PACKAGES=(mesa-vulkan-drivers libvulkan1)

have_loader() { ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1 '; }
have_lavapipe() { compgen -G '/usr/share/vulkan/icd.d/lvp_icd*.json' >/dev/null; }

if have_loader && have_lavapipe; then
    exit 0
fi

if ! command -v apt-get >/dev/null; then
    echo "ensure_vulkan: Mesa's software Vulkan (lavapipe) or libvulkan.so.1 is missing and" \
        "apt-get is not available: install your distribution's Mesa Vulkan drivers and Vulkan" \
        "loader to run the vulkan-spirv tests" >&2
    exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    SUDO=(sudo -n)
fi
APT=("${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=600)
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT

install() { "${APT[@]}" install -y --no-install-recommends "${PACKAGES[@]}" >"$LOG" 2>&1; }

echo "ensure_vulkan: installing ${PACKAGES[*]} (software Vulkan for the vulkan-spirv tests)"
if ! install; then
    # Stale or missing package lists are the usual cause: refresh them once and retry.
    if ! "${APT[@]}" update >"$LOG" 2>&1 || ! install; then
        cat "$LOG" >&2
        echo "ensure_vulkan: could not install ${PACKAGES[*]}" >&2
        exit 1
    fi
fi
