# What `ninja install` puts where, and the Debian package CPack makes of it (docs/packaging.md).
#
# scripts/package.sh is the way in: it builds modeld and modelctl, then runs cpack in the build
# tree with the package version; nothing else is compiled (see CMAKE_SKIP_INSTALL_ALL_DEPENDENCY).
# Paths below are relative to CMAKE_INSTALL_PREFIX (/usr in the package) except /etc.

# cpack runs the `preinstall` target, which by default depends on `all`: every unit test and tool.
# The package holds two programs; building them is package.sh's job (ninja modeld modelctl).
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY TRUE)

set(MODELD_PKG_SRC ${CMAKE_CURRENT_SOURCE_DIR}/packaging)
set(MODELD_PKG_GEN ${CMAKE_CURRENT_BINARY_DIR}/packaging)
set(MODELD_DOC_DIR share/doc/modeld)

# Files made at install time, so that they carry the version being packaged
# ($MODELD_PACKAGE_VERSION, set by package.sh; default: the project's) without a reconfigure:
# the gzipped man pages and changelog (gzip -n: no timestamp, reproducible), and the model
# examples under /etc/modeld/models.d with a header saying how to enable them.
install(CODE "
  set(gen \"${MODELD_PKG_GEN}\")
  set(src \"${MODELD_PKG_SRC}\")
  set(version \"\$ENV{MODELD_PACKAGE_VERSION}\")
  if(NOT version)
    set(version \"${PROJECT_VERSION}\")
  endif()
  file(MAKE_DIRECTORY \"\${gen}\")
  include(\"${CMAKE_CURRENT_SOURCE_DIR}/packaging/generate.cmake\")
  modeld_generate_package_files(\"\${src}\" \"\${gen}\" \"\${version}\" \"${CMAKE_CURRENT_SOURCE_DIR}\")
")

# Programs.
install(TARGETS modeld modelctl RUNTIME DESTINATION bin)

# systemd: units as they are in systemd/, the group of control.group, state and runtime folders,
# and the journal message catalog (systemd's dpkg trigger on /usr/lib/systemd/catalog runs
# journalctl --update-catalog).
install(FILES systemd/modeld.service systemd/modeld.socket systemd/modeld-serve@.service
        DESTINATION lib/systemd/system)
install(FILES ${MODELD_PKG_SRC}/sysusers.conf DESTINATION lib/sysusers.d RENAME modeld.conf)
install(FILES ${MODELD_PKG_SRC}/tmpfiles.conf DESTINATION lib/tmpfiles.d RENAME modeld.conf)
install(FILES ${MODELD_PKG_SRC}/modeld.catalog DESTINATION lib/systemd/catalog)

# Configuration: conffiles (listed in packaging/conffiles). The model examples end in .example,
# which the loader ignores, so a fresh install has no models and passes --check-config.
install(FILES config/modeld.toml DESTINATION /etc/modeld)
install(FILES config/models.d/README
              ${MODELD_PKG_GEN}/kimi-k2-5.toml.example
              ${MODELD_PKG_GEN}/minimax-m2-5.toml.example
              ${MODELD_PKG_GEN}/qwen3-235b.toml.example
        DESTINATION /etc/modeld/models.d)

# Documentation.
install(FILES ${MODELD_PKG_GEN}/modeld.8.gz DESTINATION share/man/man8)
install(FILES ${MODELD_PKG_GEN}/modelctl.1.gz DESTINATION share/man/man1)
install(FILES ${MODELD_PKG_SRC}/copyright README.md ${MODELD_PKG_GEN}/changelog.gz
        DESTINATION ${MODELD_DOC_DIR})
# Written by other stages: OPTIONAL checks at install (packaging) time, so a file that appears
# later is packaged without a reconfigure, and a missing one is no error. modeld.service's
# Documentation= names hardening.md.
install(FILES ${MODELD_PKG_SRC}/bash-completion/modelctl
        DESTINATION share/bash-completion/completions OPTIONAL)
install(FILES docs/hardening.md DESTINATION ${MODELD_DOC_DIR} OPTIONAL)

# -- CPack: one Debian package, modeld_VERSION_ARCH.deb --------------------------------------
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME modeld)
set(CPACK_PACKAGE_VENDOR "modeld maintainers")
set(CPACK_PACKAGE_CONTACT "modeld maintainers <maintainers@users.noreply.a-seed-f5081470.example>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "puts large language models into service as systemd units")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_DIRECTORY ${CMAKE_BINARY_DIR}/packages)
set(CPACK_STRIP_FILES ON)
set(CPACK_INSTALL_DEFAULT_DIRECTORY_PERMISSIONS
    OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION admin)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# Shared libraries from dpkg-shlibdeps; besides them: systemd (units, systemctl, sysusers,
# tmpfiles, journalctl for `modelctl logs`), a system bus (modeld manages units over D-Bus), and
# init-system-helpers (deb-systemd-helper/-invoke in the maintainer scripts).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS
    "systemd (>= 252), default-dbus-system-bus | dbus-system-bus, init-system-helpers (>= 1.56)")
# modelctl's completion is loaded by bash-completion; promtool checks /metrics.
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "bash-completion")
# The extended description (CPack puts CPACK_PACKAGE_DESCRIPTION_SUMMARY first and indents
# each line; an empty line becomes a paragraph break).
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "modeld is a daemon that deploys a large language model on a GPU host as one
safe, observable and resumable operation: it frees disk, downloads a
checkpoint from a Hugging Face Hub-compatible server, verifies it, stops the
model service that runs now, launches the new inference server (vLLM, SGLang,
TGI, llama.cpp: any command) as a systemd unit and health-checks it, rolling
back when the new model fails.

modelctl is its command-line client; both talk HTTP/JSON over a Unix socket.")
# A dash-free version makes a native package: changelog.gz, no Debian revision.
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${MODELD_PKG_SRC}/postinst ${MODELD_PKG_SRC}/prerm ${MODELD_PKG_SRC}/postrm
    ${MODELD_PKG_SRC}/conffiles)
# Maintainer scripts 0755, conffiles 0644, whatever the checkout's modes.
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)

include(CPack)
