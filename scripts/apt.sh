# Sourced by the install scripts: apt_install PKG... installs Debian packages (with sudo when not root).
apt_install() {
    (($#)) || return 0
    echo "$(basename "$0"): installing $* with apt"
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}
