#![no_main]
// See turnpike_proxy::fuzzing::chunked.
libfuzzer_sys::fuzz_target!(|data: &[u8]| turnpike_proxy::fuzzing::chunked(data));
