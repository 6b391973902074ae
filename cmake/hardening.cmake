# What Debian builds its daemons with (dpkg-buildflags' "hardening=+all" on amd64), for every
# target: modeld runs as root and parses what the network sends. _FORTIFY_SOURCE needs an
# optimised build, so Debug goes without it; sanitizer builds keep their own instrumentation.
option(MODELD_HARDENING "Build with fortified libc calls, stack protection and full RELRO" ON)
if(MODELD_HARDENING AND NOT MODELD_SANITIZE)
  add_compile_options($<$<NOT:$<CONFIG:Debug>>:-D_FORTIFY_SOURCE=2> -fstack-protector-strong
                      -fstack-clash-protection -fcf-protection)
  add_link_options(-Wl,-z,relro -Wl,-z,now)
endif()
